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
      golden/                  held-out inputs and reference outputs (.npz, no pickle)

Bundles are sealed (:mod:`edgeinfer.contract.seal`): the manifest is validated in full when a bundle is
opened, every path it names must stay inside the bundle, and ``files`` records the size and
sha256 of every file. ``open`` compares sizes; ``golden``, ``serve`` and ``verify`` hash everything.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edgeinfer.contract import packages, seal
from edgeinfer.contract.backend import TensorSpec
from edgeinfer.contract.helpers import first_line
from edgeinfer.errors import InputError
from edgeinfer.model import buckets as buckets_mod
from edgeinfer.model import decoder_bundle
from edgeinfer.model.buckets import BucketsSection
from edgeinfer.model.decoder_bundle import DecoderSection
from edgeinfer.model.kind import MANIFEST, find

SCHEMA = "edgeinfer.bundle/1"
MAX_SEQ = 131_072  # longest text a bundle may pad to (long-context embedding models use 8192)
MAX_DIM = 2**31 - 1
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: NumPy's kind letter of the dtype names manifests use, known without importing NumPy (serve's HTTP process
#: opens manifests and does not import it: tests/test_light_core.py)
_KINDS = {"bool": "b", **{f"{p}int{n}": p[:1] or "i" for p in ("", "u") for n in (8, 16, 32, 64)},
          **{f"float{n}": "f" for n in (16, 32, 64)}}


def dtype_kind(name: str) -> str:
    """NumPy's kind letter of dtype ``name`` ("" when it is not a dtype)."""
    if name in _KINDS:
        return _KINDS[name]
    import numpy as np

    try:
        return np.dtype(name).kind
    except TypeError:
        return ""


# --- the manifest: one schema, validated in full before anything in it is used ----------------------------

_STRICT = ConfigDict(extra="forbid", strict=True)
DISK = "disk"  # validation context of a manifest read from a bundle (its backend is the nested object only)


class _Tensor(BaseModel):
    model_config = _STRICT
    name: StrictStr = Field(min_length=1, max_length=512)
    shape: list[Annotated[int, Field(ge=0, le=MAX_DIM)] | StrictStr | None] = Field(max_length=32)
    dtype: StrictStr

    @field_validator("dtype")
    @classmethod
    def _numeric(cls, v: str) -> str:
        kind = dtype_kind(v)
        if kind not in "biuf" or not kind:
            raise ValueError(f"{v!r} is not a numeric NumPy dtype")
        return v


# a model input or output: a TensorSpec in Python, validated as _Tensor, written with its to_json
Tensor = Annotated[
    _Tensor,
    BeforeValidator(lambda v: v.to_json() if isinstance(v, TensorSpec) else v),
    AfterValidator(lambda t: TensorSpec(t.name, tuple(t.shape), t.dtype)),
    PlainSerializer(lambda s: s.to_json()),
]


class TextSpec(BaseModel):
    """How text becomes feeds and outputs become embeddings."""

    model_config = _STRICT
    tokenizer: StrictStr = "tokenizer"  # directory inside the bundle
    max_length: int = Field(128, ge=1, le=MAX_SEQ)
    pooling: Literal["mean", "cls", "none"] = "mean"
    normalize: StrictBool = True
    output: StrictStr = "last_hidden_state"


class TaskSpec(BaseModel):
    """What a text model's logits mean. No task section: the outputs are embeddings (or tensors). ``rerank``: a
    cross-encoder scoring (query, document) pairs, one logit per pair; ``classify``: one logit per label, the
    labels in ``labels`` in logit order. ``activation`` turns logits into the scores a user sees."""

    model_config = _STRICT
    kind: Literal["rerank", "classify"]
    labels: list[StrictStr] = Field(default=[], max_length=65_536)
    activation: Literal["sigmoid", "softmax", "none"] = "none"


class _Golden(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    threshold: Any = None
    passed: StrictBool | None = None
    samples: Annotated[int, Field(ge=0)] | None = None
    outputs: dict[str, Any] | None = None

    @field_validator("threshold")
    @classmethod
    def _cosine(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not -1 <= v <= 1:
            raise ValueError(f"must be a cosine similarity between -1 and 1, got {v!r}")
        return float(v)


class _Paging(BaseModel):
    model_config = _STRICT
    window: int = Field(ge=1, le=65_536)
    prefetch: StrictBool = True
    resident_prefix: Annotated[int, Field(ge=0)] | None = None
    segments: Annotated[int, Field(ge=1)] | None = None
    cuts: list[StrictStr] | None = None
    index: Any = None


class _File(BaseModel):
    model_config = _STRICT
    size: int = Field(ge=0)
    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")


class _Backend(BaseModel):
    model_config = _STRICT
    name: StrictStr = Field(min_length=1)
    versions: dict[str, StrictStr] = {}


def _as_dict(section: type[BaseModel]) -> Any:
    """A section validated by its schema and kept as the plain dict it was given (what code and JSON read)."""
    return Annotated[section, AfterValidator(lambda m: m.model_dump(exclude_unset=True)), PlainSerializer(dict)]


class Manifest(BaseModel):
    """``manifest.json``: what ``backend`` loads the bundle, for which board and scheme, the tensor specs, the plan
    summary and golden metrics, text handling, paging, buckets or the decoder section, and the file seals."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    schema_: Literal["edgeinfer.bundle/1"] = Field(SCHEMA, alias="schema")
    edgeinfer_version: StrictStr = ""
    created: StrictStr = ""
    source: dict[str, Any]
    backend_: _Backend = Field(alias="backend")
    board: StrictStr
    target: StrictStr = ""
    scheme: StrictStr
    artifacts: list[StrictStr] = Field(min_length=1, max_length=4096)
    inputs: list[Tensor] = Field(min_length=1, max_length=1024)
    outputs: list[Tensor] = Field(min_length=1, max_length=1024)
    text: TextSpec | None = None
    task: TaskSpec | None = None  # rerankers and classifiers only
    plan: dict[str, Any] | None = None
    golden: _as_dict(_Golden) | None = None  # type: ignore[valid-type]
    paging: _as_dict(_Paging) | None = None  # type: ignore[valid-type]  # {"window": W, "prefetch": bool, ...}
    files: dict[str, _as_dict(_File)] = {}  # type: ignore[valid-type]  # relative path -> {"size", "sha256"}
    decoder: _as_dict(DecoderSection) | None = None  # type: ignore[valid-type]  # decoder bundles only
    buckets: _as_dict(BucketsSection) | None = None  # type: ignore[valid-type]  # static-shape buckets
    #: integer inputs that index an embedding table of the ONNX artifact → its rows (None: not recorded, an older
    #: bundle; serving reads it instead of the model file)
    index_limits: dict[StrictStr, Annotated[int, Field(ge=0)]] | None = None
    #: the distributions (with extras) running the bundle needs, e.g. "edgeinfer[llm]" (edgeinfer.contract.packages)
    requires: list[StrictStr] = Field(default=[], max_length=64)
    #: files ``deploy --board-only`` left out: what only the converting machine's simulator reads
    #: (:meth:`~edgeinfer.contract.backend.Backend.simulation_files`)
    left_out: list[StrictStr] = Field(default=[], max_length=4096)

    @model_validator(mode="before")
    @classmethod
    def _backend_by_name(cls, data: Any, info: ValidationInfo) -> Any:
        """In Python a manifest names its backend (``backend=``, ``versions=``); on disk it is one object."""
        if info.context != DISK and isinstance(data, dict) and isinstance(data.get("backend"), str):
            data = {**data, "backend": {"name": data["backend"], "versions": data.get("versions", {})}}
            data.pop("versions", None)
        return data

    @property
    def backend(self) -> str:
        return self.backend_.name

    @property
    def versions(self) -> dict[str, str]:
        return self.backend_.versions

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for what, items in (("inputs", [t.name for t in self.inputs]), ("outputs", [t.name for t in self.outputs]),
                            ("artifacts", self.artifacts)):
            dup = sorted({n for n in items if items.count(n) > 1})
            if dup:
                raise ValueError(f"{what} lists {dup[0]!r} twice")
        if self.paging is None and len(self.artifacts) != 1:
            raise ValueError(f"artifacts: {len(self.artifacts)} artifacts but no paging section; a plain bundle has "
                             "one")
        if self.text is not None:
            _check_text(self.text, self.inputs, self.outputs)
        return self

    def to_json(self) -> dict[str, Any]:
        """The manifest as written to disk (``decoder``, ``buckets``, ``index_limits`` and ``left_out`` only when
        present)."""
        skip = {k for k in ("decoder", "buckets", "index_limits") if getattr(self, k) is None}
        skip |= set() if self.left_out else {"left_out"}
        return self.model_dump(by_alias=True, exclude=skip)


def _check_text(text: TextSpec, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    names = [o.name for o in outputs]
    if text.output not in names:
        raise ValueError(f"text.output {text.output!r} is not an output of the model ({', '.join(names)})")
    for t in inputs:
        if t.name not in TOKEN_INPUTS:
            raise ValueError(f"text bundle input {t.name!r} cannot be made from text ({', '.join(TOKEN_INPUTS)})")
        if dtype_kind(t.dtype) not in "iu":
            raise ValueError(f"text bundle input {t.name!r} has dtype {t.dtype}, token ids need an integer dtype")
        seq = t.shape[1] if len(t.shape) > 1 else None
        if isinstance(seq, int) and seq != text.max_length:
            raise ValueError(f"text.max_length {text.max_length} differs from input {t.name!r} sequence length {seq}")
    if text.pooling == "mean" and "attention_mask" not in [t.name for t in inputs]:
        raise ValueError("text.pooling 'mean' needs an attention_mask input")


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:2]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = {"extra_forbidden": "unknown field", "missing": "missing required field"}.get(err["type"], err["msg"])
        parts.append(f"{loc}: {msg.removeprefix('Value error, ')}")
    return "; ".join(parts)


def read_manifest(path: Path) -> Manifest:
    """The validated manifest of the bundle at ``path``, with every path it names checked to stay inside."""
    mf = path / MANIFEST
    seal.contained(path, MANIFEST, "manifest.json")
    try:
        data = json.loads(mf.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, OSError) as e:
        raise InputError(f"{mf} is not valid JSON ({first_line(e, 120)}); deploy the model again",
                         kind="bundle_damaged") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"{mf}: unsupported manifest schema {got!r} (this edgeinfer reads {SCHEMA})",
                         kind="bundle_damaged")
    if "files" not in data:
        raise InputError(
            f"{mf} records no file sizes and hashes (written by an edgeinfer before bundles were sealed); "
            "deploy the model again to re-create the bundle", kind="bundle_damaged"
        )
    try:
        manifest = Manifest.model_validate(data, context=DISK)
    except ValidationError as e:
        raise InputError(f"{mf}: {_validation_message(e)}; deploy the model again", kind="bundle_damaged") from None
    _check_paths(path, manifest)
    return manifest


def _check_paths(path: Path, m: Manifest) -> None:
    for rel in m.files:
        seal.contained(path, rel, f"files[{rel!r}]")
    sealed = {seal.relative(rel, "files") for rel in m.files}
    named = [(f"artifacts[{i}]", a) for i, a in enumerate(m.artifacts)]
    if m.text is not None:
        seal.contained(path, m.text.tokenizer, "text.tokenizer")
        named.append(("text.tokenizer", f"{m.text.tokenizer}/tokenizer.json"))
    if m.decoder is not None:
        decoder_bundle.check_paths(path, m.decoder, sealed)
    if m.buckets is not None:
        buckets_mod.check_paths(path, m.buckets, sealed)
    for field_name, rel in named:
        seal.contained(path, rel, field_name)
        norm = seal.relative(rel, field_name)
        if norm not in sealed and not (m.decoder and any(f.startswith(norm + "/") for f in sealed)):
            raise InputError(
                f"manifest {field_name} {rel!r} is not among the bundle's recorded files; deploy the model again",
                kind="bundle_damaged",
            )


def not_a_bundle(path: Path) -> InputError:
    """The error for a path that is no bundle (missing, or without a manifest)."""
    if not path.exists():
        return InputError(f"bundle not found: {path}", kind="bundle_missing")
    return InputError(f"{path} is not a bundle (no {MANIFEST}); create one with `edgeinfer deploy`",
                      kind="bundle_missing")


def write(directory: Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` (atomically) into ``directory``; fills version, time and the file seals.

    Every file in the directory is recorded with its size and sha256 (``files``): a bundle is
    sealed when its manifest is written, so write the manifest last.
    """
    from edgeinfer.version import __version__

    manifest.edgeinfer_version = manifest.edgeinfer_version or __version__
    manifest.created = manifest.created or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    directory.mkdir(parents=True, exist_ok=True)
    manifest.files = seal.record(directory, skip={MANIFEST, MANIFEST + ".tmp"})
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    tmp.replace(directory / MANIFEST)
    return directory / MANIFEST


class Bundle:
    """A bundle directory opened for use: manifest validated, paths contained, files checked."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, verify: str = "size") -> Bundle:
        """Open a bundle. ``verify``: ``"size"`` (every open) or ``"full"`` (sha256 of every file too)."""
        p = Path(path)
        if not _bundle(p):
            raise not_a_bundle(p)
        manifest = read_manifest(p)
        seal.verify(p, manifest.files, full=verify == "full")
        return cls(p, manifest)

    def file(self, rel: str, what: str) -> Path:
        """A sealed file of the bundle by its relative path (contained, recorded in the manifest)."""
        if rel not in self.manifest.files:
            raise InputError(f"bundle {self.path} has no {what} ({rel}); deploy the model again",
                             kind="bundle_damaged")
        return seal.contained(self.path, rel, what)

    @property
    def artifacts(self) -> list[Path]:
        return [self.path / a for a in self.manifest.artifacts]

    @property
    def tokenizer_file(self) -> Path:
        """The ``tokenizer.json`` of a text bundle (contained in the bundle)."""
        text = self.manifest.text
        if text is None:
            raise InputError(f"bundle {self.path} has no tokenizer: pass tensors with --input instead of --text")
        return seal.contained(self.path, f"{text.tokenizer}/tokenizer.json", "text.tokenizer")


def _bundle(path: Path) -> bool:
    kind = find(path)
    return kind is not None and kind.bundle


def verify(path: str | Path, reseal: bool = False) -> dict[str, Any]:
    """Check every file of a bundle against its manifest (sizes and sha256): the report of ``edgeinfer verify``.

    A manifest that is invalid or names a path outside the bundle raises InputError; damaged files
    (``problems``), symlinks leading out of the bundle (``outside_links``) and files the manifest does not
    record (``unrecorded``) are listed, all at once; ``ok`` is True when all three are empty. ``reseal``
    records the unrecorded files (``resealed``) when nothing recorded is damaged and no link leads out.
    ``requires`` checks each distribution the manifest says the bundle runs with against this installation;
    ``refused`` lists the artifacts whose stamps the installed backend would refuse at load (another toolkit
    release it does not read, another target), each with why; ``installed``: all of them are here and none is
    refused.
    """
    p = Path(path)
    if not _bundle(p):
        raise not_a_bundle(p)
    manifest = read_manifest(p)
    links, problems = seal.outside_links(p), seal.check(p, manifest.files, full=True)
    extra, resealed = seal.unrecorded(p, manifest.files, {MANIFEST}), []
    if reseal and extra and not problems and not links:
        write(p, manifest)
        resealed = [f for f in extra if f in manifest.files]
        extra = seal.unrecorded(p, manifest.files, {MANIFEST})  # symlinks are never sealed
    size = sum(int(r["size"]) for r in manifest.files.values())
    requires = packages.check(manifest.requires)
    present = all(r["installed"] for r in requires)
    refused = _refused(p, manifest) if present and not problems else []
    return {"bundle": str(p), "ok": not (problems or links or extra), "files": len(manifest.files), "bytes": size,
            "problems": problems, "outside_links": links, "unrecorded": extra, "resealed": resealed,
            "requires": requires, "refused": refused, "installed": present and not refused,
            "left_out": manifest.left_out}


def _refused(p: Path, manifest: Manifest) -> list[dict[str, str]]:
    """The bundle's artifacts the installed backend would refuse at load, by their stamps (no artifact is opened)."""
    from edgeinfer.contract import registry, stamp
    from edgeinfer.errors import BackendUnavailableError

    try:
        backend = registry.get_backend(manifest.backend)
    except BackendUnavailableError as e:
        return [{"artifact": manifest.artifacts[0], "reason": str(e)}]
    out = []
    for rel in manifest.artifacts:
        try:
            stamp.check(p / rel, backend=backend, device=None)
        except (InputError, BackendUnavailableError) as e:  # the artifact's fault, or what this machine lacks
            out.append({"artifact": rel, "reason": str(e)})
    return out
