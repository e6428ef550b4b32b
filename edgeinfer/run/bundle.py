"""A bundle (:mod:`edgeinfer.model.bundle`) opened for use: a Session on its backend (paged when segmented,
bucketed when it holds static-shape buckets), feeds from texts through its tokenizer and embeddings from
outputs, and a Generator over a decoder bundle with the manifest checked against the live decoder.
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract import registry as plugins
from edgeinfer.contract import remote_code
from edgeinfer.contract.backend import Session, TensorSpec
from edgeinfer.errors import InputError, check_text
from edgeinfer.model import decoder_bundle
from edgeinfer.model.bundle import Bundle
from edgeinfer.run import buckets as buckets_mod
from edgeinfer.run import paged_decoder
from edgeinfer.run.decoder_load import DecoderLoad, disagree, open_load

if TYPE_CHECKING:
    import numpy as np

    from edgeinfer.run.generation.generator import Generator

_TOKENIZERS: weakref.WeakKeyDictionary[Bundle, Any] = weakref.WeakKeyDictionary()


def open_session(bundle: Bundle, device: str | None = None, **options: Any) -> Session:
    """Load the bundle on its backend (paged when the bundle is segmented)."""
    m = bundle.manifest
    if m.decoder is not None:  # generators come from edgeinfer.load (docs/generation.md)
        raise InputError(f"bundle {bundle.path} holds a decoder (language) model, which runs on text: use "
                         "`edgeinfer generate` / `chat`, or edgeinfer.load() for a Generator")
    backend = plugins.get_backend(m.backend)
    if m.paging:
        from edgeinfer.run.paged import PagedSession

        opts = {**m.paging, **options}
        return PagedSession.from_artifacts(backend, bundle.artifacts, device=device, **opts)
    if m.buckets:
        return buckets_mod.open_buckets(backend, bundle.path, m.buckets, device, **options)
    return backend.load(bundle.artifacts[0], device=device, **options)


# --- text bundles ----------------------------------------------------------------------------------------


def tokenizer(bundle: Bundle) -> Any:
    """The text bundle's tokenizer, loaded once per opened bundle."""
    tok = _TOKENIZERS.get(bundle)
    if tok is None:
        path = bundle.tokenizer_file  # a bundle without text says so here
        tok = _TOKENIZERS[bundle] = load_tokenizer(path, bundle.manifest.text.max_length)
    return tok


def tokenize_texts(bundle: Bundle, texts: list[str]) -> dict[str, np.ndarray]:
    """Feeds for ``texts``, padded to the bundle's sequence length, matching its input specs."""
    return tokenize(tokenizer(bundle), texts, bundle.manifest.inputs)


def embed(bundle: Bundle, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Pool (and normalise) the hidden states as the bundle specifies: one vector per text."""
    import numpy as np

    text = bundle.manifest.text
    assert text is not None
    hidden = np.asarray(outputs[text.output], dtype=np.float32)
    if text.pooling == "cls":
        vec = hidden[:, 0]
    elif text.pooling == "mean":
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        vec = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)
    else:
        vec = hidden.reshape(len(hidden), -1)
    if text.normalize:
        vec = vec / np.clip(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12, None)
    return vec


def load_tokenizer(path: Path, max_length: int) -> Any:
    """A ``tokenizers`` tokenizer that truncates and pads every text to ``max_length``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        from edgeinfer.contract.packages import install_line
        from edgeinfer.errors import BackendUnavailableError

        raise BackendUnavailableError("text bundles need the 'tokenizers' package", install_line("edgeinfer[text]"),
                                      kind="package_missing") from None

    if not path.is_file():
        raise InputError(f"tokenizer not found: {path}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with a serde message
        first = (str(e).strip().splitlines() or ["unreadable"])[0][:120]
        raise InputError(f"{path} is not a valid tokenizer.json ({first}); copy the model's tokenizer.json "
                         "again or deploy again") from None
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(length=max_length, pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
    return tok


def tokenize(tok: Any, texts: list[str] | list[tuple[str, str]], specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Feeds for ``texts`` with the model's input names and dtypes (BERT-style token inputs); a (text, text)
    pair is encoded as one sequence with two segments (token_type_ids 0 and 1), as cross-encoders take it."""
    import numpy as np

    for i, t in enumerate(texts):
        for part in (t if isinstance(t, tuple) else (t,)):
            check_text(part, f"text {i}")
    enc = tok.encode_batch(list(texts))
    columns = {
        "input_ids": [e.ids for e in enc],
        "attention_mask": [e.attention_mask for e in enc],
        "token_type_ids": [e.type_ids for e in enc],
    }
    feeds = {}
    for spec in specs:
        if spec.name not in columns:
            raise InputError(f"model input {spec.name!r} cannot be made from text; pass it with --input")
        feeds[spec.name] = np.asarray(columns[spec.name], dtype=spec.dtype)
    return feeds


# --- decoder bundles --------------------------------------------------------------------------------------


@remote_code.entry_point
def open_generator(bundle: Bundle, device: str | None = None, ctx: int | None = None, backend: str | None = None,
                   slots: int = 1, *, trust_remote_code: bool = False, codec: Any = None,
                   **options: Any) -> Generator:
    """A Generator over a decoder bundle, with a KV cache of ``ctx`` positions (default: the bundle's); a
    layer-paged bundle with its recorded window, or ``window=W`` (:mod:`edgeinfer.run.paged_decoder`).
    ``trust_remote_code``: for an artifact that is a Hugging Face directory naming code of its own. ``codec``:
    the bundle tokenizer's :class:`~edgeinfer.run.generation.text.TokenFacts`, already read, instead of the
    tokenizer."""
    load = decoder_load(bundle, ctx, slots, backend, options.pop("window", None))
    return open_load(load, codec, device, slots, verify=False, **options)  # the caller opened (verified) the bundle


def decoder_load(bundle: Bundle, ctx: int | None = None, slots: int = 1, backend: str | None = None,
                 window: int | None = None) -> DecoderLoad:
    """What loading the decoder bundle's artifact takes, from its manifest checked against itself, ``slots``,
    ``backend`` and the model's config.json before any weights load (:mod:`edgeinfer.run.decoder_load`)."""
    m = bundle.manifest
    if backend and backend != m.backend:
        raise InputError(f"bundle {bundle.path} is for backend {m.backend!r}, not {backend!r}; omit --backend")
    ctx = decoder_bundle.loaded_context(bundle, ctx)
    decoder_bundle.check_slots(bundle, slots)
    tokenizer = decoder_bundle.tokenizer_dir(bundle)
    check_manifest(bundle, tokenizer)
    return DecoderLoad(bundle.path, m.backend, bundle.artifacts[0], tokenizer, m.scheme, ctx, m.decoder["vocab_size"],
                       m.decoder.get("kv_dtype"), dict(m.files), paged_decoder.load_window(bundle, window, ctx))


# --- the manifest's facts against the files they describe ---------------------------------------------
# Only paths and sizes are sealed at load (a same-size edit passes): a fact the runtime also knows is
# compared with it, so that a manifest that lies fails here in one line instead of generating garbage.


def check_manifest(bundle: Bundle, tokenizer: Path) -> None:
    """The manifest against itself, the decoder contract (int64 ids in, float32 logits out) and the model's
    own config.json (kept with the tokenizer, in the directory ``tokenizer``), before the weights load."""
    m = bundle.manifest.decoder
    for t in (*bundle.manifest.inputs, *bundle.manifest.outputs):
        want = {"input_ids": "int64", "logits": "float32"}.get(t.name)
        if want and t.dtype != want:
            raise disagree(bundle.path, f"{t.name} dtype", t.dtype, "what every decoder takes or gives", want)
        if t.name == "logits" and t.shape and isinstance(t.shape[-1], int) and t.shape[-1] != m["vocab_size"]:
            raise disagree(bundle.path, "logits width", t.shape[-1], "its decoder.vocab_size", m["vocab_size"])
    cfg = tokenizer / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a bundle may keep no config.json; the artifact checks below still run
    data = data if isinstance(data, dict) else {}
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    limit, vocab = (data.get(k, text.get(k)) for k in ("max_position_embeddings", "vocab_size"))
    if isinstance(limit, int) and not isinstance(limit, bool) and m["context"] > limit:
        raise disagree(bundle.path, "decoder.context", m["context"], "the model's max_position_embeddings", limit)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab != m["vocab_size"]:
        raise disagree(bundle.path, "decoder.vocab_size", m["vocab_size"], "the model's config.json vocab_size",
                       vocab)
