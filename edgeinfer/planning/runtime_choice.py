"""Another runtime of the plan's board that decodes the same scheme faster here: ``plan``'s ``suggestions.runtime``.

A board can list one scheme under several runtimes (``host``: fp16 under onnxruntime and llama.cpp), and the
one ``deploy`` builds by default (docs/planner.md#what-plan-and-deploy-build) is not always the fastest for it:
onnxruntime holds fp16 weights as fp32 on a CPU without fp16 kernels, where llama.cpp reads them as fp16. The
plan names the fastest other runtime that this installation builds, that takes the plan's scheme, fits the board
at the same context and batch, and whose decode estimate is at least :data:`FASTER` times the plan's; both
estimates are the planner's, with their own error bars (``--runtime NAME`` plans and deploys it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.planning.decision import option
from edgeinfer.planning.serve_memory import served

FASTER = 1.2


def faster_runtime(p: Any, plan: Callable[..., Any]) -> dict[str, Any] | None:
    """The suggestion for plan ``p`` (a ``planner.Plan``; ``plan`` is ``planner.plan``), or None. A model file
    that runs in one runtime only (a .rkllm) gets none."""
    own = p.estimates.decode_tokens_per_s
    if p.model.encoder or p.model.runtime or not own or p.details.paging is not None:
        return None
    best = None
    for name, rt in p.board.runtimes.items():
        if name == p.runtime or "decoder" not in rt.kinds or p.scheme.name not in rt.schemes:
            continue
        if option(p.model, p.board, name, "decoder", p.scheme).cannot_build is not None:
            continue
        try:
            alt = plan(p.model, p.board, quant=p.scheme.name, ctx=p.ctx, batch=p.batch, runtime=name, suggest=False,
                       prefill_chunk=p.prefill_chunk)
        except EdgeInferError:  # a runtime this model cannot be planned on is no suggestion
            continue
        tps = alt.estimates.decode_tokens_per_s
        if alt.fits and tps and tps >= FASTER * own and (best is None or tps > best["decode_tokens_per_s"]):
            best = {"runtime": name, "decode_tokens_per_s": tps, "speedup": round(tps / own, 2),
                    "total_bytes": alt.total_bytes, "basis": alt.estimates.basis,
                    "served_bytes": served(alt.breakdown, alt.model.vocab)["total_bytes"]}
    return best
