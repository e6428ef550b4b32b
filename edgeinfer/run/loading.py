"""``edgeinfer.load``: pick the backend for a file, convert it when it is not native, cache the result.

A cache entry is sealed (:mod:`edgeinfer.contract.seal`) once the conversion is complete and hashed again
before each reuse: a damaged or half-written entry is converted again, never loaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import cache, remote_code, stamp
from edgeinfer.contract import registry as plugins
from edgeinfer.contract.backend import Backend, Session
from edgeinfer.contract.names import DECODER_REFERENCE, ENCODER_REFERENCE
from edgeinfer.errors import InputError, ModelError
from edgeinfer.model.kind import Kind, find, kind, model_context_limit
from edgeinfer.planning.device_memory import check_decoder_fits

if TYPE_CHECKING:
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

# keys of **options that change the converted artifact (the rest only affect load)
CONVERT_OPTIONS = ("scheme", "shapes", "target")


def choose_backend(path: Path, name: str | None) -> Backend:
    if name:
        return plugins.get_backend(name)
    stamped = stamp.read(path) if path.exists() else None
    if stamped:
        return plugins.get_backend(stamped["backend"])
    reference = plugins.registry().backend(ENCODER_REFERENCE)
    if reference is not None and reference.cls().is_native(path):  # the reference wins for plain ONNX; no other
        return reference.cls()  # plugin's backend module is imported for it
    candidates = [n for n in plugins.backend_names() if plugins.get_backend(n).is_native(path)]
    if candidates:
        return plugins.get_backend(candidates[0])
    raise InputError(
        f"no installed backend loads {path.suffix or 'this kind of'} files natively; pass --backend "
        f"(installed: {', '.join(plugins.backend_names()) or 'none'})"
    )


def converted(backend: Backend, path: Path, options: dict[str, Any]) -> Path:
    """The cached native artifact for ``path`` on ``backend``, converting it on first use."""
    convert_opts = {k: options.pop(k) for k in CONVERT_OPTIONS if k in options}
    scheme = convert_opts.pop("scheme", None) or backend.tensors.default_scheme
    key = cache.key({"sha256": stamp.sha256_file(path), **cache.made_by(backend), "scheme": scheme,
                     "options": convert_opts})
    entry = cache.area("artifacts") / backend.name / key
    name = path.stem + backend.tensors.native[0]
    if cache.intact(entry) and (entry / name).is_file():
        return entry / name
    shutil.rmtree(entry, ignore_errors=True)  # damaged, or stored under another file name
    return cache.fill(entry, lambda d: backend.quantize(path, scheme, None, d / name, **convert_opts)) / name


def parse_shapes(items: tuple[str, ...] | list[str]) -> dict[str, list[int]]:
    """``NAME=1x128`` → {NAME: [1, 128]}."""
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise InputError(f"--shape {item!r} is not NAME=DIMxDIM..., e.g. input_ids=1x128")
        shapes[name] = shape
    return shapes


@remote_code.entry_point
def load(path: Any, backend: str | None = None, device: str | None = None, *, trust_remote_code: bool = False,
         **options: Any) -> Session | Generator:
    """Open the model reference at ``path``: a Generator for a decoder (directory, file or bundle), else a Session
    (a bundle on its backend; a file on ``backend`` or the one its stamp or suffix names, converted when needed)."""
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run import bundle as run_bundle

    p = Path(path)
    match kind(p, "model file"):
        case Kind.DECODER_DIR:
            return load_generator(p, backend=backend, device=device, trust_remote_code=trust_remote_code, **options)
        case Kind.DECODER_FILE:
            return load_decoder_file(p, backend=backend, device=device, **options)
        case Kind.DECODER_BUNDLE:
            return run_bundle.open_generator(Bundle.open(p), device=device, backend=backend,
                                             trust_remote_code=trust_remote_code, **options)
        case Kind.ENCODER_BUNDLE:
            bundle = Bundle.open(p)
            if backend and backend != bundle.manifest.backend:
                raise InputError(f"bundle {p} is for backend {bundle.manifest.backend!r}, not {backend!r}; "
                                 "omit --backend")
            return run_bundle.open_session(bundle, device=device, **options)
    be = choose_backend(p, backend)
    if not be.is_native(p):
        p = converted(be, p, options)
    elif "shapes" in options:
        raise InputError(f"shapes apply when a model is converted; {p.name} is already native to {be.name}")
    return be.load(p, device=device, **options)


def decoder_backend(path: Path, found: Kind, backend: str | None) -> str:
    """The backend a decoder reference loads on: a bundle's, a decoder file's runtime's, else ``backend`` or the
    transformers reference (a wrong ``backend`` is refused by the load itself)."""
    from edgeinfer.model.bundle import read_manifest

    if found is Kind.DECODER_BUNDLE:
        return read_manifest(path).backend
    owner = plugins.decoder_file(path) if found is Kind.DECODER_FILE else None
    return owner[0] if owner else backend or DECODER_REFERENCE


def threads_option(backend: str, threads: int | None) -> dict[str, int]:
    """``--threads N`` of generate, chat, bench and serve as a decoder load option: ``{"threads": N}`` for a
    backend whose decoders take it, nothing for one whose decoders do not (an NPU runtime has no CPU threads to
    set) or without ``--threads``."""
    if threads is None:
        return {}
    if isinstance(threads, bool) or threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}")
    return {"threads": threads} if "threads" in plugins.get_backend(backend).decoders.options else {}


def spin_wait_option(backend: str, spin_wait: bool | None) -> dict[str, bool]:
    """serve's ``spin_wait`` (:meth:`edgeinfer.serve.config.ServeConfig.spin_wait`) as a decoder load option, for a
    backend whose decoders take it; nothing for ``None`` (the backend's default) or another backend."""
    if spin_wait is None or "spin_wait" not in plugins.get_backend(backend).decoders.options:
        return {}
    return {"spin_wait": spin_wait}


def decoder_threads(path: Path, found: Kind, backend: str | None, threads: int | None) -> dict[str, int]:
    """:func:`threads_option` for the decoder at ``path`` (of kind ``found``, loaded on ``backend``)."""
    return {} if threads is None else threads_option(decoder_backend(path, found, backend), threads)


def default_context(model_dir: Path) -> int:
    """The context a decoder directory loads with when none is asked for: the planning rule (its limit, capped;
    :func:`edgeinfer.planning.decision.default_context`), the context ``plan`` and ``deploy`` use."""
    from edgeinfer.planning import decision  # board profiles and their schema: not for serve's decoder workers

    return decision.default_context(model_context_limit(model_dir))


@remote_code.entry_point
def load_generator(
    model_dir: Path, backend: str | None = None, device: str | None = None, ctx: int | None = None,
    slots: int = 1, *, trust_remote_code: bool = False, codec: Any = None, **options: Any,
) -> Generator:
    """A text generator over ``model_dir`` on ``backend`` (default: the transformers reference),
    with a KV cache of ``ctx`` positions (default: the model's limit, at most 2048). ``trust_remote_code``:
    let libraries import the Python files ``model_dir`` names in ``auto_map`` (otherwise it is refused).
    ``codec``: the tokenizer's :class:`~edgeinfer.run.generation.text.TokenFacts`, already read elsewhere."""
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    if find(model_dir) is not Kind.DECODER_DIR:
        raise ModelError(f"{model_dir} is not a causal language model (its config.json names no *ForCausalLM)")
    remote_code.allowed(model_dir)
    codec = codec or TextCodec(model_dir)  # a bad tokenizer fails before the weights load
    context = ctx if ctx is not None else default_context(model_dir)
    name = backend or DECODER_REFERENCE
    if name == DECODER_REFERENCE:
        _check_reference_weights(model_dir)
    be = plugins.get_backend(name)
    check_decoder_fits(be, model_dir, device, context, slots, options.get("scheme"))
    decoder = be.load_decoder(model_dir, device=device, context=context, slots=slots, **options)
    return Generator(decoder, codec, model_dir.resolve().name)


# what transformers' from_pretrained reads: weights, or the index of a sharded checkpoint (whose shards the
# reference plugin checks itself)
REFERENCE_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin",
                     "pytorch_model*.bin.index.json")


def _check_reference_weights(model_dir: Path) -> None:
    """A decoder directory without weights transformers reads is a runtime's export (an OpenVINO IR keeps the
    model's config.json) or a config-only download: one line that says so, not a failure of the reference
    plugin's load."""
    if not any(next(model_dir.glob(pattern), None) for pattern in REFERENCE_WEIGHTS):
        raise ModelError(f"{model_dir} holds no weights the transformers reference reads (*.safetensors, "
                         "pytorch_model*.bin)", "a runtime's exported model runs on the backend that exported it — "
                         "generate, chat and bench take --backend — or from a deployed bundle")


def file_default_context(path: Path) -> int:
    """The context a decoder file loads with when none is asked for: as for the model directory it sits in
    (its config.json), else, for a lone ``.gguf``, from the limit its own metadata records."""
    if (path.parent / "config.json").is_file() or path.suffix.lower() != ".gguf":
        return default_context(path.parent)
    from edgeinfer.planning import decision
    from edgeinfer.planning.models.gguf import read_gguf

    return decision.default_context(read_gguf(path).max_position)


def decoder_file_scheme(path: Path) -> str:
    """A decoder file's scheme as the planner names it (``gguf:Q8_0``, ``fp16``): a ``.gguf`` records it, an
    ``.rkllm`` does not (``""``)."""
    if path.suffix.lower() != ".gguf":
        return ""
    from edgeinfer.planning.models.gguf import read_gguf

    return read_gguf(path).file_scheme or ""


def decoder_file_codec(path: Path) -> TextCodec:
    """The tokenizer of a decoder file (``.rkllm``, ``.gguf``): the one in its directory, else the vocabulary
    the file's backend reads from the file itself (a ``.gguf``'s own); edgeinfer tokenizes and detokenizes
    itself, the file's runtime takes and gives token ids."""
    from edgeinfer.run.generation.text import TextCodec, VocabularyCodec

    if (path.parent / "tokenizer.json").is_file():
        return TextCodec(path.parent)
    owner = plugins.decoder_file(path)
    vocab = plugins.get_backend(owner[0]).read_vocabulary(path) if owner else None
    if vocab is None:
        raise InputError(f"{path.name} has no tokenizer.json next to it: edgeinfer tokenizes the text itself",
                         f"put the tokenizer files (tokenizer.json, tokenizer_config.json, config.json) of the model "
                         f"it was converted from into {path.parent}")
    return VocabularyCodec(vocab, path, owner[0])


def load_decoder_file(path: Path, backend: str | None = None, device: str | None = None, ctx: int | None = None,
                      slots: int = 1, *, codec: Any = None, **options: Any) -> Generator:
    """A text generator over a decoder file a backend runs as it is (``Decoders.native``: ``.rkllm``), with
    the tokenizer next to it (or ``codec``, its :class:`~edgeinfer.run.generation.text.TokenFacts`) and a
    context of ``ctx`` (default: as for a model directory, from the config.json next to it)."""
    from edgeinfer.run.generation.generator import Generator

    owner = plugins.decoder_file(path)
    if owner is None:
        raise InputError(f"no installed backend runs {path.suffix} decoder files")
    if backend and backend != owner[0]:
        raise InputError(f"{path.name} runs on backend {owner[0]!r} ({owner[1]}), not {backend!r}; omit --backend")
    codec = codec or decoder_file_codec(path)
    context = ctx if ctx is not None else file_default_context(path)
    decoder = plugins.get_backend(owner[0]).load_decoder(path, device=device, context=context, slots=slots,
                                                         **options)
    return Generator(decoder, codec, path.name)
