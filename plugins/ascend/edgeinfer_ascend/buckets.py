"""Static shape buckets: pad token batches up to fixed (batch, seq) sizes so that graph mode
(TorchAir on Ascend, inductor elsewhere) compiles once per bucket instead of once per shape.

Padding positions carry ``attention_mask == 0`` (and pad token 0), so the outputs at valid
positions are those of the unpadded run; padded rows / columns are cut off again after the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from edgeinfer.errors import FeedError, InputError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_SEQ_BUCKETS = (64, 128, 256, 512)
DEFAULT_BATCH_BUCKETS = (1, 8, 32)


def parse_buckets(value: object, name: str, default: Sequence[int]) -> tuple[int, ...]:
    """``None`` -> default, ``"64,128"`` / ``[64, 128]`` -> sorted tuple; ``"off"``/``()`` -> ()."""
    if value is None:
        return tuple(default)
    if isinstance(value, str):
        if value.strip().lower() in ("off", "none", "0", ""):
            return ()
        value = [v for v in value.replace(" ", "").split(",") if v]
    try:
        out = tuple(sorted({int(v) for v in value}))  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a list of positive integers like 64,128,256, got {value!r}") from None
    if any(v < 1 for v in out):
        raise InputError(f"{name} must be positive integers, got {value!r}")
    return out


def pick(n: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= n, or None when n exceeds every bucket."""
    return next((b for b in buckets if b >= n), None)


def batch_chunks(n: int, batch_buckets: Sequence[int]) -> Iterator[slice]:
    """Split n rows into chunks no larger than the largest batch bucket."""
    step = max(batch_buckets) if batch_buckets else n
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def bucket_for(batch: int, seq: int, batch_buckets: Sequence[int], seq_buckets: Sequence[int]) -> tuple[int, int]:
    b = pick(batch, batch_buckets) if batch_buckets else batch
    s = pick(seq, seq_buckets) if seq_buckets else seq
    if s is None:
        raise FeedError(
            f"sequence length {seq} is longer than the largest shape bucket {max(seq_buckets)}; "
            f"truncate the input or load with seq_buckets=...,{seq}"
        )
    assert b is not None  # callers chunk the batch first
    return b, s


def pad(feeds: dict[str, np.ndarray], batch: int, seq: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Pad every [b, s] token input to [batch, seq]; padding is masked (attention_mask 0)."""
    import numpy as np
    out = {}
    for name, arr in feeds.items():
        b, s = arr.shape[:2]
        fill = pad_id if name == "input_ids" else 0
        padded = np.full((batch, seq) + arr.shape[2:], fill, dtype=arr.dtype)
        padded[:b, :s] = arr
        out[name] = padded
    return out
