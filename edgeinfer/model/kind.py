"""What a model reference is: the one answer to "what kind of thing is this path?".

Every command, ``serve`` and ``fleet`` ask :func:`kind` once and switch on the answer. It reads names,
stamps and the headers of ``manifest.json`` / ``config.json`` only (no numpy, no backend), so it is cheap
at start-up; opening the thing is :mod:`edgeinfer.run.loading`'s job, and its errors (a damaged bundle,
a file no backend loads) come from there.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from edgeinfer.contract import registry, seal, stamp
from edgeinfer.errors import InputError

MANIFEST = "manifest.json"
CONFIG = "config.json"


class Kind(enum.Enum):
    ONNX = "ONNX file"
    PT2 = "torch.export program"  # a deploy source (.pt2)
    NATIVE = "backend artifact"  # any other file, or a stamped directory: a backend loads it as it is
    ENCODER_DIR = "Hugging Face model directory"
    DECODER_DIR = "Hugging Face causal language model directory"
    ENCODER_BUNDLE = "bundle"
    DECODER_BUNDLE = "decoder bundle"
    DECODER_FILE = "decoder artifact"  # a vendor toolkit's LLM file a backend runs as it is (Decoders.native)

    @property
    def bundle(self) -> bool:
        return self in (Kind.ENCODER_BUNDLE, Kind.DECODER_BUNDLE)

    @property
    def decoder(self) -> bool:
        return self in (Kind.DECODER_DIR, Kind.DECODER_BUNDLE, Kind.DECODER_FILE)


def kind(path: str | Path, what: str = "model", hint: str | None = None) -> Kind:
    """The kind of the model reference at ``path``; InputError when it does not exist (``what`` not found,
    with ``hint``; kind bundle_missing where ``what`` is "bundle", else model_not_found) or is a directory that
    is none of the kinds (bundle_missing where ``what`` is "bundle")."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{what} not found: {p}", hint,
                         kind="bundle_missing" if what == "bundle" else "model_not_found")
    found = find(p)
    if found is None:
        raise InputError(f"{p} is not a bundle, a model directory or a backend artifact (no {MANIFEST}, {CONFIG} "
                         "or stamp)", "give a bundle made by `edgeinfer deploy`, a Hugging Face directory or a "
                         "model file", kind="bundle_missing" if what == "bundle" else "bad_input")
    return found


def find(path: str | Path) -> Kind | None:
    """The kind of ``path``, or None when it does not exist or is a directory that is none of the kinds.

    A directory with ``manifest.json`` is a bundle (a decoder bundle when the manifest has a ``decoder``
    section; a manifest that cannot be read counts as a bundle, so that opening it says what is wrong); one with
    ``config.json`` a Hugging Face directory (a decoder when its ``architectures`` name a ``*ForCausalLM``); one
    with a stamp a backend artifact. A file is ONNX (``.onnx``), a torch.export program (``.pt2``), a decoder
    artifact (a suffix an installed backend's ``Decoders.native`` names, e.g. ``.rkllm``) or a backend artifact
    (stamped, or of a suffix some backend loads: the backend choice says when none does).
    """
    p = Path(path)
    if not p.is_dir():
        if not p.exists():
            return None
        suffix = p.suffix.lower()
        if suffix in (".onnx", ".pt2"):
            return Kind.ONNX if suffix == ".onnx" else Kind.PT2
        return Kind.DECODER_FILE if registry.decoder_file(p) else Kind.NATIVE
    if (p / MANIFEST).is_file():
        header = _json(seal.contained(p, MANIFEST, MANIFEST))
        return Kind.DECODER_BUNDLE if header.get("decoder") is not None else Kind.ENCODER_BUNDLE
    if (p / CONFIG).is_file():
        return Kind.DECODER_DIR if _causal_lm(_json(p / CONFIG)) else Kind.ENCODER_DIR
    return Kind.NATIVE if stamp.stamp_path(p).is_file() else None


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or {} when it is unreadable or not an object (its opener reports why)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _causal_lm(config: dict[str, Any]) -> bool:
    archs = config.get("architectures")
    return isinstance(archs, list) and any(isinstance(a, str) and a.endswith("ForCausalLM") for a in archs)


def model_context_limit(model_dir: Path) -> int | None:
    """The positions a Hugging Face model was trained for (``max_position_embeddings``), when it says."""
    limit = _json(model_dir / CONFIG).get("max_position_embeddings")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
