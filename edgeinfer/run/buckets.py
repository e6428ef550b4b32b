"""Static-shape buckets: a bundle for a backend that compiles static shapes (an NPU) holds one artifact per
(batch × sequence) shape, and a run picks the smallest bucket that holds its rows and its longest sequence,
pads to it and cuts the padding off the outputs.

The manifest's ``buckets`` section (written by :mod:`edgeinfer.deploy.buckets`)::

    "buckets": {"chosen_by": "...", "items": [{"batch": 1, "seq": 128, "artifact": "model.xml"},
                                              {"batch": 4, "seq": 32, "artifact": "buckets/4x32/model.xml"}, ...]}

Padding rows repeat the last row; padding positions get token id 0 with ``attention_mask`` 0, which no
unmasked position attends to, so outputs at the real positions do not change (sequence buckets are only
made for models with an ``attention_mask`` input).
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from edgeinfer.contract import seal
from edgeinfer.contract.backend import Session, TensorSpec
from edgeinfer.errors import FeedError, InputError

log = logging.getLogger("edgeinfer.buckets")
MASK = "attention_mask"
Shape = tuple[int, int]  # (batch, seq)


class BucketItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    batch: int = Field(ge=1, le=65_536)
    seq: int = Field(ge=1, le=131_072)
    artifact: StrictStr = Field(min_length=1)
    golden: Annotated[dict[str, Any], Field()] | None = None


class BucketsSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    chosen_by: StrictStr = ""
    items: list[BucketItem] = Field(min_length=1, max_length=64)

    @model_validator(mode="after")
    def _unique(self) -> BucketsSection:
        shapes = [(i.batch, i.seq) for i in self.items]
        arts = [i.artifact for i in self.items]
        if len(set(shapes)) != len(shapes) or len(set(arts)) != len(arts):
            raise ValueError("each bucket needs its own (batch, seq) and its own artifact")
        return self


def check_paths(path: Path, section: dict[str, Any], sealed: set[str]) -> None:
    """Every bucket artifact stays inside the bundle and is among its sealed files."""
    for i, item in enumerate(section["items"]):
        what = f"buckets.items[{i}].artifact"
        seal.contained(path, item["artifact"], what)
        if seal.relative(item["artifact"], what) not in sealed:
            raise InputError(f"manifest {what} {item['artifact']!r} is not among the bundle's recorded files; "
                             "deploy the model again")


def longest_seq(section: dict[str, Any] | None, inputs: list[TensorSpec]) -> int | None:
    """A bucketed bundle with sequence buckets (and an attention mask) takes any length up to this; else None."""
    seqs = {i["seq"] for i in section["items"]} if section else set()
    return max(seqs) if len(seqs) > 1 and MASK in {s.name for s in inputs} else None


# --- choosing a bucket -----------------------------------------------------------------------------------


def pick(shapes: list[Shape], rows: int, seq: int) -> Shape | None:
    """The smallest bucket (fewest batch × seq positions; then shorter seq) with ``batch >= rows`` and
    ``seq >= seq``, or None when none holds them."""
    fits = [s for s in shapes if s[0] >= rows and s[1] >= seq]
    return min(fits, key=lambda s: (s[0] * s[1], s[1], s[0])) if fits else None


def chunks(shapes: list[Shape], rows: int, seq: int) -> list[tuple[int, int, Shape]]:
    """``(start, stop, bucket)`` runs covering ``rows`` rows of length ``seq``: as few runs as the largest
    batch among buckets long enough allows, each run on the smallest bucket that holds it."""
    longest = max((s[0] for s in shapes if s[1] >= seq), default=0)
    if not longest:
        raise FeedError(f"inputs of {seq} tokens are longer than the longest bucket "
                        f"({max(s[1] for s in shapes)} tokens)", "truncate the inputs or deploy with longer buckets")
    out = []
    for start in range(0, rows, longest):
        stop = min(rows, start + longest)
        bucket = pick(shapes, stop - start, seq)
        assert bucket is not None
        out.append((start, stop, bucket))
    return out


def trim(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Token feeds cut after the last position any row attends to (trailing padding dropped)."""
    mask = feeds.get(MASK)
    if mask is None or mask.ndim != 2 or not mask.size:
        return feeds
    used = np.nonzero(mask.any(axis=0))[0]
    length = int(used[-1]) + 1 if used.size else 1
    return {k: (v[:, :length] if v.ndim >= 2 and v.shape[:2] == mask.shape else v) for k, v in feeds.items()}


def _pad(feeds: dict[str, np.ndarray], batch: int, seq: int) -> dict[str, np.ndarray]:
    out = {}
    for k, v in feeds.items():
        if v.ndim >= 2 and v.shape[1] < seq:
            v = np.concatenate([v, np.zeros((v.shape[0], seq - v.shape[1], *v.shape[2:]), v.dtype)], axis=1)
        if len(v) < batch:
            v = np.concatenate([v, np.repeat(v[-1:], batch - len(v), axis=0)])
        out[k] = np.ascontiguousarray(v)
    return out


# --- the session ---------------------------------------------------------------------------------------------


class BucketedSession(Session):
    """Several sessions of one model, one per static (batch, seq) shape, seen as one model with a free batch
    and (for masked models) a free sequence length. ``counts`` records the runs per bucket."""

    def __init__(self, sessions: dict[Shape, Session]):
        self.sessions = dict(sorted(sessions.items()))
        first = next(iter(self.sessions.values()))
        self.seq_free = MASK in {s.name for s in first.inputs} and len({s for _, s in self.sessions}) > 1
        self._seq_outputs = {o.name for o in first.outputs if self._has_seq_axis(o.name)}
        super().__init__([self._relaxed(s, self.seq_free) for s in first.inputs],
                         [self._relaxed(o, o.name in self._seq_outputs) for o in first.outputs], first.device)
        self.backend_name = first.backend_name
        self.load_ms = sum(s.load_ms or 0.0 for s in self.sessions.values())
        self.counts: collections.Counter[Shape] = collections.Counter()

    @property
    def shapes(self) -> list[Shape]:
        return list(self.sessions)

    def _has_seq_axis(self, name: str) -> bool:
        """Axis 1 of the output follows the bucket's length (or the artifact leaves it symbolic)."""
        dims = [([o.shape for o in sess.outputs if o.name == name] or [()])[0] for sess in self.sessions.values()]
        return all(len(d) > 1 and (d[1] == s or not isinstance(d[1], int)) for d, (_, s) in zip(dims, self.sessions))

    @staticmethod
    def _relaxed(spec: TensorSpec, seq_free: bool) -> TensorSpec:
        if not spec.shape:
            return spec
        rest = ("sequence", *spec.shape[2:]) if seq_free and len(spec.shape) > 1 else spec.shape[1:]
        return TensorSpec(spec.name, ("batch", *rest), spec.dtype)

    def _seq(self, feeds: dict[str, np.ndarray]) -> int:
        """The sequence length buckets must hold (0 when the buckets share one length)."""
        return max((v.shape[1] for v in feeds.values() if v.ndim >= 2), default=0) if self.seq_free else 0

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(feeds.values())))
        seq = self._seq(feeds)
        parts = []
        for start, stop, (b, s) in chunks(self.shapes, rows, seq):
            out = self.sessions[(b, s)].run(_pad({k: v[start:stop] for k, v in feeds.items()}, b, s))
            self.counts[(b, s)] += 1
            log.debug("bucket %dx%d for %d row(s) of %d tokens", b, s, stop - start, seq)
            parts.append({k: (v[: stop - start, :seq] if self._cut_seq(k, v, s) else v[: stop - start])
                          for k, v in out.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _cut_seq(self, name: str, value: np.ndarray, seq: int) -> bool:
        return self.seq_free and name in self._seq_outputs and value.ndim > 1 and value.shape[1] == seq

    def op_times(self, feeds: dict[str, np.ndarray]) -> list[Any]:
        """Per-op times of the bucket the first chunk of ``feeds`` runs on."""
        rows = len(next(iter(feeds.values())))
        seq = self._seq(feeds)
        start, stop, (b, s) = chunks(self.shapes, rows, seq)[0]
        return self.sessions[(b, s)].op_times(_pad({k: v[start:stop] for k, v in feeds.items()}, b, s))

    def profile_notes(self) -> dict[str, Any]:
        return {"buckets": [f"{b}x{s}" for b, s in self.shapes],
                "bucket_runs": {f"{b}x{s}": n for (b, s), n in sorted(self.counts.items())}}

    def release(self) -> None:
        for s in self.sessions.values():
            s.close()


def open_buckets(backend: Any, path: Path, section: dict[str, Any], device: str | None,
                 **options: Any) -> BucketedSession:
    """Load every bucket artifact of the bundle at ``path`` on ``backend``."""
    sessions: dict[Shape, Session] = {}
    try:
        for item in section["items"]:
            sessions[(item["batch"], item["seq"])] = backend.load(path / item["artifact"], device=device, **options)
    except BaseException:
        for s in sessions.values():
            s.close()
        raise
    return BucketedSession(sessions)
