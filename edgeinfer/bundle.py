"""Bundles: a deployed model as a directory — artifact(s) plus ``manifest.json``.

A bundle is what ``edgeinfer deploy`` writes and what ``run``, ``golden``,
``bench`` and ``serve`` read. Its manifest says which backend loads it, for which
board and scheme, the tensor specs, the plan summary and the golden metrics; for
text models it also names the bundled tokenizer and how outputs are pooled.

Layout::

    bundle/
      manifest.json            versioned (schema: edgeinfer/schemas/manifest.schema.json)
      model.xml, model.bin     the backend's artifact (one or several for segmented bundles)
      model.xml.stamp.json     the artifact's stamp
      tokenizer/               tokenizer.json (+ config) for text models
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .backend import Session, TensorSpec
from .errors import InputError

SCHEMA = "edgeinfer.bundle/1"
MANIFEST = "manifest.json"


@dataclass
class TextSpec:
    """How text becomes feeds and outputs become embeddings."""

    tokenizer: str = "tokenizer"  # directory inside the bundle
    max_length: int = 128
    pooling: str = "mean"  # "mean" | "cls" | "none"
    normalize: bool = True
    output: str = "last_hidden_state"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Manifest:
    backend: str
    board: str
    scheme: str
    artifacts: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    source: dict[str, Any]
    versions: dict[str, str] = field(default_factory=dict)
    target: str = ""
    text: TextSpec | None = None
    plan: dict[str, Any] | None = None
    golden: dict[str, Any] | None = None
    paging: dict[str, Any] | None = None  # {"window": W, "prefetch": bool, "resident_prefix": n}
    created: str = ""
    edgeinfer_version: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "edgeinfer_version": self.edgeinfer_version,
            "created": self.created,
            "source": self.source,
            "backend": {"name": self.backend, "versions": self.versions},
            "board": self.board,
            "target": self.target,
            "scheme": self.scheme,
            "artifacts": self.artifacts,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "text": self.text.to_json() if self.text else None,
            "plan": self.plan,
            "golden": self.golden,
            "paging": self.paging,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        text = d.get("text")
        return cls(
            backend=d["backend"]["name"],
            versions=d["backend"].get("versions", {}),
            board=d["board"],
            target=d.get("target", ""),
            scheme=d["scheme"],
            artifacts=list(d["artifacts"]),
            inputs=[TensorSpec.from_json(s) for s in d["inputs"]],
            outputs=[TensorSpec.from_json(s) for s in d["outputs"]],
            source=d["source"],
            text=TextSpec(**text) if text else None,
            plan=d.get("plan"),
            golden=d.get("golden"),
            paging=d.get("paging"),
            created=d.get("created", ""),
            edgeinfer_version=d.get("edgeinfer_version", ""),
        )


def is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


def write(directory: Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` (atomically) into ``directory``; fills version and time."""
    from . import __version__

    manifest.edgeinfer_version = manifest.edgeinfer_version or __version__
    manifest.created = manifest.created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    tmp.replace(directory / MANIFEST)
    return directory / MANIFEST


class Bundle:
    """A bundle directory opened for use."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path) -> Bundle:
        p = Path(path)
        if not p.exists():
            raise InputError(f"bundle not found: {p}")
        if not is_bundle(p):
            raise InputError(f"{p} is not a bundle (no {MANIFEST}); create one with `edgeinfer deploy`")
        try:
            data = json.loads((p / MANIFEST).read_text())
        except ValueError as e:
            raise InputError(f"{p / MANIFEST} is not valid JSON ({e}); deploy the model again") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, dict) else None
            raise InputError(f"{p / MANIFEST}: unsupported manifest schema {got!r} (this edgeinfer reads {SCHEMA})")
        try:
            manifest = Manifest.from_json(data)
        except (KeyError, TypeError) as e:
            raise InputError(f"{p / MANIFEST} is missing or has a malformed field {e}; deploy the model again") from None
        for a in manifest.artifacts:
            if not (p / a).exists():
                raise InputError(f"bundle {p} is incomplete: artifact {a} is missing; deploy the model again")
        return cls(p, manifest)

    @property
    def artifacts(self) -> list[Path]:
        return [self.path / a for a in self.manifest.artifacts]

    def load(self, device: str | None = None, **options: Any) -> Session:
        """Load the bundle on its backend (paged when the bundle is segmented)."""
        from . import plugins

        backend = plugins.get_backend(self.manifest.backend)
        if self.manifest.paging:
            from .paging import PagedSession

            opts = {**self.manifest.paging, **options}
            return PagedSession.from_artifacts(backend, self.artifacts, device=device, **opts)
        return backend.load(self.artifacts[0], device=device, **options)

    # --- text models ------------------------------------------------------------------------------

    @cached_property
    def _tokenizer(self) -> Any:
        text = self.manifest.text
        if text is None:
            raise InputError(f"bundle {self.path} has no tokenizer: pass tensors with --input instead of --text")
        return load_tokenizer(self.path / text.tokenizer / "tokenizer.json", text.max_length)

    def tokenize(self, texts: list[str]) -> dict[str, np.ndarray]:
        """Feeds for ``texts``, padded to the bundle's sequence length, matching its input specs."""
        return tokenize(self._tokenizer, texts, self.manifest.inputs)

    def embed(self, outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Pool (and normalise) the hidden states as the model specifies: one vector per text."""
        text = self.manifest.text
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
        from .errors import BackendUnavailableError

        raise BackendUnavailableError("text bundles need the 'tokenizers' package",
                                      "pip install 'edgeinfer[text]' (from a clone: pip install '.[text]')") from None

    if not path.is_file():
        raise InputError(f"tokenizer not found: {path}")
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(length=max_length, pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
    return tok


def tokenize(tok: Any, texts: list[str], specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """Feeds for ``texts`` with the model's input names and dtypes (BERT-style token inputs)."""
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


def static_batch(specs: list[TensorSpec]) -> int | None:
    """The fixed batch size of a model whose inputs all have a static first dimension, else None."""
    dims = {s.shape[0] if s.shape else None for s in specs}
    if len(dims) == 1:
        (d,) = dims
        return d if isinstance(d, int) and d > 0 else None
    return None


def run_padded(session: Session, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``feeds`` of any batch size on a session whose batch may be static.

    Rows are cut into chunks of the static batch; the last chunk is padded by
    repeating its last row, and padded rows are dropped from the outputs. Every
    output must have the batch on axis 0.
    """
    fixed = static_batch(session.inputs)
    n = len(next(iter(feeds.values())))
    if fixed is None or n == fixed:
        return session.run(feeds)
    parts: list[dict[str, np.ndarray]] = []
    for start in range(0, n, fixed):
        chunk = {k: v[start : start + fixed] for k, v in feeds.items()}
        rows = len(next(iter(chunk.values())))
        if rows < fixed:
            chunk = {k: np.concatenate([v, np.repeat(v[-1:], fixed - rows, axis=0)]) for k, v in chunk.items()}
        out = session.run(chunk)
        parts.append({k: v[:rows] for k, v in out.items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
