"""Static-shape buckets: a bundle for a backend that compiles static shapes (an NPU) holds one artifact per
(batch × sequence) shape, and a run picks the smallest bucket that holds its rows and its longest sequence,
pads to it and cuts the padding off the outputs.

The manifest's ``buckets`` section is :mod:`edgeinfer.model.buckets`.

Padding rows repeat the last row; padding positions get token id 0 with ``attention_mask`` 0, which no
unmasked position attends to, so outputs at the real positions do not change (sequence buckets are only
made for models with an ``attention_mask`` input).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeinfer.contract.backend import Session, TensorSpec
from edgeinfer.errors import FeedError
from edgeinfer.model.buckets import MASK

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edgeinfer.buckets")
Shape = tuple[int, int]  # (batch, seq)


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
    import numpy as np

    mask = feeds.get(MASK)
    if mask is None or mask.ndim != 2 or not mask.size:
        return feeds
    used = np.nonzero(mask.any(axis=0))[0]
    length = int(used[-1]) + 1 if used.size else 1
    return {k: (v[:, :length] if v.ndim >= 2 and v.shape[:2] == mask.shape else v) for k, v in feeds.items()}


def _pad(feeds: dict[str, np.ndarray], batch: int, seq: int) -> dict[str, np.ndarray]:
    import numpy as np

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
    and (for masked models) a free sequence length. ``counts`` records the runs per bucket.

    A bucket is given as its session or as a function that loads it: the first (smallest batch) is loaded at once
    (its specs are the model's), the others on first use, so a run that needs one bucket compiles one
    (``edgeinfer run`` on a 9-bucket RKNN bundle); :meth:`load_all` loads the rest up front (``serve``)."""

    def __init__(self, buckets: dict[Shape, Session | Callable[[], Session]]):
        self._buckets = dict(sorted(buckets.items()))
        self._loaded: dict[Shape, Session] = {}
        first = self._session(next(iter(self._buckets)))
        self.seq_free = MASK in {s.name for s in first.inputs} and len({s for _, s in self._buckets}) > 1
        self._seq_outputs = {o.name for o in first.outputs if self._has_seq_axis(o.name)}
        super().__init__([self._relaxed(s, self.seq_free) for s in first.inputs],
                         [self._relaxed(o, o.name in self._seq_outputs) for o in first.outputs], first.device)
        self.backend_name = first.backend_name
        self.counts: collections.Counter[Shape] = collections.Counter()

    @property
    def shapes(self) -> list[Shape]:
        return list(self._buckets)

    @property
    def load_ms(self) -> float:  # the buckets loaded so far
        return sum(s.load_ms or 0.0 for s in self._loaded.values())

    def _session(self, shape: Shape) -> Session:
        if shape not in self._loaded:
            item = self._buckets[shape]
            self._loaded[shape] = item if isinstance(item, Session) else item()
            log.debug("bucket %dx%d loaded", *shape)
        return self._loaded[shape]

    def load_all(self) -> None:
        """Load every bucket now, so that no request waits for a compile."""
        for shape in self._buckets:
            self._session(shape)

    def _has_seq_axis(self, name: str) -> bool:
        """Axis 1 of the output follows the bucket's length (or the artifact leaves it symbolic), in every
        bucket loaded so far."""
        dims = {shape: ([o.shape for o in sess.outputs if o.name == name] or [()])[0]
                for shape, sess in self._loaded.items()}
        return all(len(d) > 1 and (d[1] == s or not isinstance(d[1], int)) for (_, s), d in dims.items())

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
        import numpy as np

        rows = len(next(iter(feeds.values())))
        seq = self._seq(feeds)
        parts = []
        for start, stop, (b, s) in chunks(self.shapes, rows, seq):
            out = self._session((b, s)).run(_pad({k: v[start:stop] for k, v in feeds.items()}, b, s))
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
        return self._session((b, s)).op_times(_pad({k: v[start:stop] for k, v in feeds.items()}, b, s))

    def profile_notes(self) -> dict[str, Any]:
        return {"buckets": [f"{b}x{s}" for b, s in self.shapes],
                "bucket_runs": {f"{b}x{s}": n for (b, s), n in sorted(self.counts.items())}}

    def release(self) -> None:
        for s in self._loaded.values():
            s.close()


def open_buckets(backend: Any, path: Path, section: dict[str, Any], device: str | None,
                 **options: Any) -> BucketedSession:
    """The bundle at ``path`` as one session over its bucket artifacts on ``backend``, each loaded on first use
    (:class:`BucketedSession`)."""

    def loader(artifact: Path) -> Callable[[], Session]:
        return lambda: backend.load(artifact, device=device, **options)

    return BucketedSession({(item["batch"], item["seq"]): loader(path / item["artifact"])
                            for item in section["items"]})
