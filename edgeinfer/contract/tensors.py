"""Tensors at the contract boundary: a model input's or output's spec, the check of caller feeds against
those specs (names, dtypes, shapes, symbolic dimensions), and the check of what a plugin's session returns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from edgeinfer.errors import BackendError, FeedError

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


def validate_outputs(specs: Sequence[TensorSpec], outputs: Any, backend: str) -> dict[str, np.ndarray]:
    """Check what backend ``backend``'s ``Session.infer`` returned against the session's declared ``specs``:
    a mapping with every declared output and no other, each an array of the declared dtype, rank and fixed
    dimensions. A mismatch is the plugin's fault: BackendError (exit 3, plugin_failed) naming it and the output."""
    import numpy as np

    def fail(problem: str) -> BackendError:
        return BackendError(f"backend {backend or '?'!r} failed: its session returned {problem}",
                            "the plugin's Session.infer must return every output it declares in Session.outputs")

    if not isinstance(outputs, Mapping):
        raise fail(f"{type(outputs).__name__}, not a mapping of output name to array")
    names = [s.name for s in specs]
    declared = ", ".join(names) or "none"
    for name in outputs:
        if name not in names:
            raise fail(f"output {name!r}, which it does not declare (declared: {declared})")
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name not in outputs:
            raise fail(f"no output {spec.name!r} (declared: {declared}; returned: {', '.join(outputs) or 'none'})")
        arr = outputs[spec.name]
        if not isinstance(arr, np.ndarray):
            raise fail(f"output {spec.name!r} as {type(arr).__name__}, not a NumPy array")
        if arr.dtype.name != spec.dtype:
            raise fail(f"output {spec.name!r} as {arr.dtype.name}, declared {spec.dtype}")
        fixed = [(want, got) for want, got in zip(spec.shape, arr.shape) if isinstance(want, int) and want >= 0]
        if arr.ndim != len(spec.shape) or any(want != got for want, got in fixed):
            raise fail(f"output {spec.name!r} with shape {_fmt_shape(arr.shape)}, declared {_fmt_shape(spec.shape)}")
        arrays[spec.name] = arr
    return arrays


def _fmt_shape(shape: Iterable[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
