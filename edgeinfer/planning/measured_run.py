"""A measured decoder run planned as it ran: the KV positions it held and what it held in all, where the runtime's
KV cache is resident only as positions are written (the profile's ``decoder_kv_lazy``). A plan counts the whole
context's KV, what a decoder holds once it has run that long; a fitted overhead (``bench/fit_speed.py``,
``edgeinfer calibrate``) and ``edgeinfer bench``'s self-check compare a run with what that run held."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeinfer.planning.activations import activation_bytes, as_ran
from edgeinfer.planning.overhead import layer_overhead_bytes
from edgeinfer.planning.planner import kv_bytes, runtime_profile, weights_bytes
from edgeinfer.planning.quant import kv_bytes_per_element

if TYPE_CHECKING:
    from edgeinfer.contract.schemes import Scheme
    from edgeinfer.planning.models.spec import ModelSpec
    from edgeinfer.planning.planner import Plan


def kv_positions_held(prof: dict, written: int, allocated: int) -> int:
    """The KV positions a measured decoder held in memory: the ``written`` ones where the runtime's cache pages
    become resident only as positions are written (the profile's ``decoder_kv_lazy``), else all ``allocated``."""
    return written if (prof.get("decoder_kv_lazy") or {}).get("value") else allocated


def held_by_run(p: Plan, prompt: int, written: int) -> int | None:
    """Bytes a decoder planned as ``p`` holds after a run that prefilled ``prompt`` tokens and wrote ``written``
    KV positions, where its runtime's KV cache is resident only as written (:func:`kv_positions_held`): the plan's
    weights and runtime overhead, the KV of those positions and the activations of that prompt
    (:func:`.activations.as_ran`), as the host rows are planned when their overhead is fitted. None for other
    runtimes: a run holds the plan's figure for the context."""
    prof = runtime_profile(p.runtime)
    if kv_positions_held(prof, written, p.ctx) == p.ctx:
        return None
    kv = kv_bytes(p.model, written, p.batch, kv_bytes_per_element(p.kv_dtype, p.model.head_dim))
    act, _ = activation_bytes(p.model, p.ctx, p.batch, as_ran(prof, prompt), p.scheme)
    return p.breakdown["weights"] + p.breakdown["runtime"] + kv + act


def row_bytes(spec: ModelSpec, scheme: Scheme, prof: dict, kv_b: float, row: dict) -> tuple[int, int]:
    """(weights, all the plan counts but the runtime's fixed overhead) for a measured row (``ctx`` the positions it
    wrote, ``mem_ctx`` those its cache was allocated for, ``prompt`` the tokens it prefilled), planned as it ran: the
    KV positions it held, its prompt's activations, the per-layer overhead. The attention is planned as the
    runtime's, not the scheme's: the onnxruntime host rows of 2026-12-06 ran the decoders' own attention op (one row
    of scores), but planned with every score held their residuals spread less (84-94 MiB against 86-99), a buffer
    the activation rule does not count. What a row's residual overhead is fitted against (``bench/fit_speed.py``,
    ``edgeinfer calibrate``)."""
    allocated = row.get("mem_ctx", row["ctx"])
    w, _ = weights_bytes(spec, scheme, prof)
    act, _ = activation_bytes(spec, allocated, 1, as_ran(prof, row.get("prompt")))
    kv = kv_bytes(spec, kv_positions_held(prof, row["ctx"], allocated), 1, kv_b)
    return w, w + kv + act + layer_overhead_bytes(spec, prof)
