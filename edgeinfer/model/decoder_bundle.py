"""Decoder bundles: what ``edgeinfer deploy`` writes for a causal language model, and how it is opened.

Layout (next to ``manifest.json``, sealed like every bundle)::

    decoder/                 the backend's decoder artifact (what ``convert_decoder`` wrote)
    decoder.stamp.json       its stamp
    tokenizer/               tokenizer.json, tokenizer_config.json, chat template, generation_config.json,
                             config.json: what the core's TextCodec reads
    golden/reference.npz     the fp32 reference's greedy tokens and logits per golden prompt

The manifest's ``decoder`` section says what the bundle is (``kind``), the context it was built
for, the vocabulary, the board runtime, where the tokenizer lives and the golden report of the deploy
(``ran: false`` with the reason, and no ``golden/``, when the artifact cannot run on the deploying host).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from edgeinfer.contract import remote_code
from edgeinfer.errors import InputError, ModelError
from edgeinfer.model import seal

if TYPE_CHECKING:
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.golden import Recorded

ARTIFACT = "decoder"
TOKENIZER = "tokenizer"
REFERENCE = "golden/reference.npz"
PROMPTS = "golden/prompts.json"
MAX_CONTEXT = 1 << 24
# the Hugging Face files the bundle keeps beside the artifact (those the model has)
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
            "generation_config.json", "config.json")


class DecoderSection(BaseModel):
    """The manifest's ``decoder`` section."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kind: Literal["causal_lm"] = "causal_lm"
    architecture: StrictStr = ""
    context: int = Field(ge=1, le=MAX_CONTEXT)  # positions the bundle was built and checked for
    vocab_size: int = Field(ge=1)
    runtime: StrictStr | None = None  # the board runtime it was built for (a board profile's runtimes)
    tokenizer: StrictStr = TOKENIZER
    golden: dict[str, Any] | None = None  # the deploy's golden report (run/generation/golden.py)
    golden_reference: StrictStr | None = REFERENCE


def check_paths(root: Path, section: dict[str, Any], sealed: set[str]) -> None:
    """The section's paths stay inside the bundle and name sealed files."""
    named = [("decoder.tokenizer", f"{section.get('tokenizer', TOKENIZER)}/tokenizer.json")]
    if section.get("golden_reference"):
        named.append(("decoder.golden_reference", section["golden_reference"]))
    for field_name, rel in named:
        seal.contained(root, rel, field_name)
        if seal.relative(rel, field_name) not in sealed:
            raise InputError(f"manifest {field_name} {rel!r} is not among the bundle's recorded files; "
                             "deploy the model again")


@remote_code.entry_point
def open_generator(bundle: Bundle, device: str | None = None, ctx: int | None = None, backend: str | None = None,
                   slots: int = 1, *, trust_remote_code: bool = False, **options: Any) -> Generator:
    """A Generator over a decoder bundle, with a KV cache of ``ctx`` positions (default: the bundle's).
    ``trust_remote_code``: for an artifact that is a Hugging Face directory naming code of its own."""
    from edgeinfer.contract import registry as plugins
    from edgeinfer.run.generation.generator import Generator
    from edgeinfer.run.generation.text import TextCodec

    m = bundle.manifest
    if backend and backend != m.backend:
        raise InputError(f"bundle {bundle.path} is for backend {m.backend!r}, not {backend!r}; omit --backend")
    ctx = loaded_context(bundle, ctx)
    codec = TextCodec(seal.contained(bundle.path, m.decoder.get("tokenizer", TOKENIZER), "decoder.tokenizer"))
    check_manifest(bundle, codec)
    be = plugins.get_backend(m.backend)
    # load_decoder reads the artifact's stamp once: another backend's or toolkit's artifact is refused there
    decoder = be.load_decoder(bundle.artifacts[0], device=device, context=ctx, slots=slots, **options)
    try:
        check_artifact(bundle, decoder, codec)
    except BaseException:
        decoder.close()
        raise
    return Generator(decoder, codec, bundle.path.resolve().name)


def loaded_context(bundle: Bundle, ctx: int | None) -> int:
    """The context to load a decoder bundle with: ``ctx``, at most the one it was built for (the default)."""
    built = int(bundle.manifest.decoder["context"])
    if ctx is None:
        return built
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise InputError(f"ctx must be a positive integer, got {ctx!r}")
    if ctx > built:
        raise InputError(f"bundle {bundle.path} was built for a context of {built} tokens, not {ctx}; use --ctx "
                         f"{built} or less, or deploy again with --ctx {ctx}")
    return ctx


# --- the manifest's facts against the files they describe ---------------------------------------------
# Only paths and sizes are sealed at load (a same-size edit passes): a fact the runtime also knows is
# compared with it, so that a manifest that lies fails here in one line instead of generating garbage.


def _disagree(bundle: Bundle, field: str, value: Any, what: str, truth: Any) -> ModelError:
    return ModelError(f"bundle {bundle.path}: manifest {field} is {value}, but {what} is {truth}; the "
                      "manifest does not describe this model: deploy the model again")


def check_manifest(bundle: Bundle, codec: Any) -> None:
    """The manifest against itself, the decoder contract (int64 ids in, float32 logits out) and the model's
    own config.json (kept with the tokenizer), before the weights load."""
    m = bundle.manifest.decoder
    for t in (*bundle.manifest.inputs, *bundle.manifest.outputs):
        want = {"input_ids": "int64", "logits": "float32"}.get(t.name)
        if want and t.dtype != want:
            raise _disagree(bundle, f"{t.name} dtype", t.dtype, "what every decoder takes or gives", want)
        if t.name == "logits" and t.shape and isinstance(t.shape[-1], int) and t.shape[-1] != m["vocab_size"]:
            raise _disagree(bundle, "logits width", t.shape[-1], "its decoder.vocab_size", m["vocab_size"])
    cfg = codec.directory / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a bundle may keep no config.json; the artifact checks below still run
    data = data if isinstance(data, dict) else {}
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    limit, vocab = (data.get(k, text.get(k)) for k in ("max_position_embeddings", "vocab_size"))
    if isinstance(limit, int) and not isinstance(limit, bool) and m["context"] > limit:
        raise _disagree(bundle, "decoder.context", m["context"], "the model's max_position_embeddings", limit)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab != m["vocab_size"]:
        raise _disagree(bundle, "decoder.vocab_size", m["vocab_size"], "the model's config.json vocab_size", vocab)


def check_artifact(bundle: Bundle, decoder: Any, codec: Any) -> None:
    """The manifest against the loaded artifact, and the tokenizer against both."""
    m = bundle.manifest.decoder
    if decoder.vocab_size != m["vocab_size"]:
        raise _disagree(bundle, "decoder.vocab_size", m["vocab_size"], "the artifact's vocabulary",
                        decoder.vocab_size)
    if codec.vocab_size > decoder.vocab_size:
        raise ModelError(f"bundle {bundle.path}: its tokenizer has {codec.vocab_size} tokens, more than the model's "
                         f"vocabulary of {decoder.vocab_size}: it would encode text into ids the model has no "
                         "embedding for; deploy the model again with its own tokenizer")


# --- the golden reference kept in the bundle ---------------------------------------------------------


def save_reference(directory: Path, recorded: list[Recorded]) -> None:
    """``golden/prompts.json`` (the prompts) and ``golden/reference.npz`` (ids and logits, no pickle)."""
    import numpy as np

    (directory / "golden").mkdir(exist_ok=True)
    (directory / PROMPTS).write_text(json.dumps([r.prompt for r in recorded], ensure_ascii=False, indent=1) + "\n")
    arrays = {}
    for i, r in enumerate(recorded):
        arrays[f"{i}/ids"] = np.asarray(r.token_ids, dtype=np.int64)
        arrays[f"{i}/logits"] = np.stack(r.logits).astype(np.float32) if r.logits else np.zeros((0, 0), np.float32)
    np.savez_compressed(directory / REFERENCE, **arrays)


def load_reference(bundle: Bundle) -> list[Recorded]:
    """The recorded reference of a decoder bundle (refused, never unpickled, when malformed)."""
    from edgeinfer.model.samples import load_saved_samples
    from edgeinfer.run.generation.golden import Recorded

    prompts_path = bundle.file(PROMPTS, "golden prompts")
    try:
        prompts = json.loads(prompts_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{prompts_path} is not valid JSON ({e}); deploy the model again") from None
    rows = load_saved_samples(bundle.file(bundle.manifest.decoder.get("golden_reference") or REFERENCE,
                                          "golden reference"))
    if not (isinstance(prompts, list) and all(isinstance(p, str) for p in prompts) and len(prompts) == len(rows)
            and all(set(r) == {"ids", "logits"} for r in rows)):
        raise InputError(f"the golden reference of bundle {bundle.path} is malformed; deploy the model again")
    return [Recorded(p, [int(t) for t in r["ids"]], list(r["logits"])) for p, r in zip(prompts, rows)]
