"""Tensors at the contract boundary: a model input's or output's spec, and the check of
caller feeds against those specs (names, dtypes, shapes, symbolic dimensions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from edgeinfer.errors import FeedError

Dim = int | str | None  # a fixed size, a symbolic name ("batch"), or unknown


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, shape (symbolic dims allowed) and NumPy dtype name."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(d["name"], tuple(d["shape"]), d["dtype"])


def validate_feeds(specs: Sequence[TensorSpec], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Check names, dtypes and shapes of ``feeds`` against ``specs``; return them as arrays."""
    import numpy as np

    by_name = {s.name: s for s in specs}
    expected = ", ".join(by_name)
    for name in feeds:
        if name not in by_name:
            raise FeedError(f"unknown input {name!r}; the model's inputs are: {expected}")
    missing = [n for n in by_name if n not in feeds]
    if missing:
        raise FeedError(f"missing input {missing[0]!r}; the model's inputs are: {expected}")
    arrays: dict[str, np.ndarray] = {}
    symbols: dict[str, tuple[int, str]] = {}
    for spec in specs:
        arr = np.asarray(feeds[spec.name])
        if arr.dtype.name != spec.dtype:
            raise FeedError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {arr.dtype.name}")
        if arr.ndim != len(spec.shape):
            raise FeedError(
                f"input {spec.name!r}: expected shape {_fmt_shape(spec.shape)}, got {_fmt_shape(arr.shape)}"
            )
        for axis, (want, got) in enumerate(zip(spec.shape, arr.shape)):
            if isinstance(want, int) and want >= 0 and want != got:
                raise FeedError(
                    f"input {spec.name!r}: expected shape {_fmt_shape(spec.shape)}, got {_fmt_shape(arr.shape)}"
                )
            if isinstance(want, str) and want:
                seen = symbols.setdefault(want, (got, spec.name))
                if seen[0] != got:
                    raise FeedError(
                        f"input {spec.name!r}: dimension {want!r} is {got} but input {seen[1]!r} has it as {seen[0]}"
                    )
        arrays[spec.name] = np.ascontiguousarray(arr)
    return arrays


def _fmt_shape(shape: Iterable[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
