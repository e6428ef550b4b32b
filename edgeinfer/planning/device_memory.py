"""Will this decoder fit on that device now? The check before a decoder loads: the backend reports what
the device has free (:meth:`~edgeinfer.contract.backend.Backend.free_memory`), the planner's arithmetic
says what the decoder needs (weights, KV cache, workspace), and a decoder that does not fit is refused
with what to change instead of failing half-way through its load with the device's out-of-memory error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgeinfer.contract.backend import Backend, FreeMemory
from edgeinfer.contract.schemes import Scheme, normalize_scheme
from edgeinfer.errors import EdgeInferError, InputError

GIB, MIB = 2**30, 2**20


def check_decoder_fits(backend: Backend, model: Path, device: str | None, context: int, slots: int,
                       scheme: str | None = None) -> None:
    """Raise an InputError saying what to change when the decoder ``model`` (``scheme``; default: the
    backend's preferred decoder scheme) with ``context`` × ``slots`` KV positions needs more memory than
    ``device`` has free. Silent when the backend cannot tell what is free, or the planner cannot read the model."""
    free = backend.free_memory(device)
    if free is None:
        return
    name = scheme or (backend.decoders.schemes[0] if backend.decoders.schemes else backend.tensors.default_scheme)
    sch = normalize_scheme(name)
    try:
        from edgeinfer.planning.models import resolve

        spec = resolve(model)
    except EdgeInferError:  # an artifact the planner cannot read (not a model directory): nothing to plan
        return

    def need_at(ctx: int) -> dict[str, int]:
        return decoder_need(spec, sch, ctx, slots, free.runtime)

    problem = shortfall(free, need_at(context), context=context, slots=slots, scheme=sch,
                        smaller=_smaller_schemes(backend, sch), need_at=lambda ctx: sum(need_at(ctx).values()))
    if problem:
        raise InputError(*problem)


def decoder_need(spec, scheme: Scheme, context: int, slots: int, runtime: str | None) -> dict[str, int]:
    """The plan of one decoder load in bytes: weights, KV cache and workspace (activations + the runtime's
    overhead), from the planner's own formulas and the runtime's profile."""
    from edgeinfer.planning import overhead, planner
    from edgeinfer.planning.activations import activation_bytes
    from edgeinfer.planning.quant import kv_bytes_per_element, runtime_kv_dtype

    prof = planner.runtime_profile(runtime) if runtime else {"kv_dtype": "scheme"}
    weights, _ = planner.weights_bytes(spec, scheme, prof)
    kv_dtype = runtime_kv_dtype(prof, scheme)
    kv = planner.kv_bytes(spec, context, slots, kv_bytes_per_element(kv_dtype, spec.head_dim))
    if not runtime:
        return {"weights": int(weights), "kv_cache": int(kv)}
    act, _ = activation_bytes(spec, context, slots, prof, scheme)
    fixed = int(overhead.runtime_overhead(prof, spec)["value"] * MIB) + overhead.layer_overhead_bytes(spec, prof)
    return {"weights": int(weights), "kv_cache": int(kv), "workspace": int(act) + fixed}


def shortfall(free: FreeMemory, need: dict[str, int], *, context: int, slots: int, scheme: Scheme,
              smaller: list[str], need_at: Callable[[int], int] | None = None) -> tuple[str, str] | None:
    """(message, fix) when the plan ``need`` does not fit in what ``free`` reports, else None. ``need_at(ctx)``:
    the plan's total at another context, to find the largest that fits (without it, only the KV cache is
    taken to scale with the context)."""
    total = sum(need.values())
    if total <= free.free_bytes:
        return None
    short = total - free.free_bytes
    parts = " + ".join(f"{k.replace('_', ' ')} {v / GIB:.2f}" for k, v in need.items())
    used = f" ({free.used_bytes // MIB} MB used)" if free.used_bytes is not None else ""
    message = (f"{free.device} has {free.free_bytes / GIB:.2f} GiB free{used} but the decoder needs "
               f"{total / GIB:.2f} GiB ({parts} GiB)")
    fixes = []
    fit = _largest_context(need_at, free.free_bytes, context) if need_at else None
    kv = need.get("kv_cache", 0)
    if fit is None and need_at is None and kv > short and context > 1:  # the KV cache is linear in the context
        fit = int(context * (kv - short) / kv)
    if fit:
        fixes.append(f"--ctx {fit} or less")
    if slots > 1:
        fixes.append(f"fewer slots than {slots}")
    if smaller:
        fixes.append("scheme " + " or ".join(smaller) + " (fewer bits per weight)")
    if free.used_bytes is not None and free.used_bytes > short:
        fixes.append(f"free the device ({free.used_bytes // MIB} MB already in use)")
    fixes.append("a device with more memory")
    return message, "use " + "; or ".join(fixes)


def _smaller_schemes(backend: Backend, scheme: Scheme) -> list[str]:
    """The backend's decoder schemes that store fewer bits per weight than ``scheme``, fewest first."""
    known = [normalize_scheme(s) for s in backend.decoders.schemes]
    return [s.name for s in sorted(known, key=lambda s: s.bpw) if s.bpw < scheme.bpw]


def _largest_context(need_at: Callable[[int], int], free: int, context: int) -> int | None:
    """The largest context below ``context`` whose plan fits in ``free`` bytes (bisection), or None."""
    lo, hi = 0, context - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need_at(mid) <= free else (lo, mid - 1)
    return lo or None
