"""Another runtime of the plan's board that decodes the same scheme faster here: ``plan``'s ``suggestions.runtime``.

A board can list one scheme under several runtimes (``host``: fp16 under onnxruntime and llama.cpp), and the one
``deploy`` builds by default (docs/planner.md#what-plan-and-deploy-build) is not always the fastest for it
(onnxruntime's fp16 ran as two int8 planes a weight, at 0.75 of llama.cpp's speed, until the onnxruntime plugin had
an fp16 op of its own). The plan names the fastest other runtime that this installation builds, that takes the
plan's scheme, fits the board at the same context and batch, and whose decode estimate is at least :data:`FASTER`
times the plan's; both estimates are the planner's, with their own error bars (``--runtime NAME`` plans and deploys
it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.planning.decision import option

FASTER = 1.2


def faster_plan(p: Any, plan: Callable[..., Any], **asks: Any) -> tuple[Any, dict[str, Any]] | None:
    """``plan`` of ``p``'s model on its board at ``p``'s context, batch and prefill chunk with ``asks`` (runtime,
    quant), with its decode figures, when it fits and its estimate is at least :data:`FASTER` times ``p``'s;
    None otherwise, or when the model cannot be planned so."""
    own = p.estimates.decode_tokens_per_s
    try:
        alt = plan(p.model, p.board, ctx=p.ctx, batch=p.batch, suggest=False, prefill_chunk=p.prefill_chunk, **asks)
    except EdgeInferError:
        return None
    tps = alt.estimates.decode_tokens_per_s
    if not alt.fits or not tps or tps < FASTER * own:
        return None
    return alt, {"decode_tokens_per_s": tps, "speedup": round(tps / own, 2), "total_bytes": alt.total_bytes,
                 "basis": alt.estimates.basis}


def faster_runtime(p: Any, plan: Callable[..., Any]) -> dict[str, Any] | None:
    """The suggestion for plan ``p`` (a ``planner.Plan``; ``plan`` is ``planner.plan``), or None. A model file
    that runs in one runtime only (a .rkllm) gets none."""
    if p.model.encoder or p.model.runtime or not p.estimates.decode_tokens_per_s or p.details.paging is not None:
        return None
    best = None
    for name, rt in p.board.runtimes.items():
        if name == p.runtime or "decoder" not in rt.kinds or p.scheme.name not in rt.schemes:
            continue
        if option(p.model, p.board, name, "decoder", p.scheme).cannot_build is not None:
            continue
        found = faster_plan(p, plan, quant=p.scheme.name, runtime=name)
        if found and (best is None or found[1]["decode_tokens_per_s"] > best["decode_tokens_per_s"]):
            alt, figures = found
            best = {"runtime": name, **figures, "served_bytes": alt.served()["total_bytes"]}
    return best
