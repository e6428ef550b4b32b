"""Running feeds of any batch size on a session whose batch may be static."""

from __future__ import annotations

import numpy as np

from edgeinfer.contract.backend import Session, TensorSpec


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
