"""The planner checks itself: an ``edgeinfer bench`` report of a decoder bundle against what ``plan``
predicts for the same board, model, scheme and context.

Decode is planned at prompt + new tokens (the KV the last step reads, as bench/data/measured_rows.yaml
counts ctx); TTFT as prompt / predicted prefill speed; peak memory (weights + KV cache + activations +
runtime overhead, without the OS reserve) at the bundle's context, for which the KV cache is allocated.
Each prompt length becomes a row `edgeinfer calibrate` accepts.
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import EdgeInferError
from edgeinfer.planning import planner
from edgeinfer.planning.boards import Board
from edgeinfer.planning.models.spec import ModelSpec

MIB = 2**20


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return round((pred - meas) / meas * 100, 2)


def _plan(spec: ModelSpec, board: Board, scheme: str, ctx: int, runtime: str | None) -> planner.Plan:
    return planner.plan(spec, board, quant=scheme, ctx=ctx, runtime=runtime, suggest=False)


def self_check(report: dict[str, Any], spec: ModelSpec, config: dict[str, Any], board: Board, scheme: str,
               context: int, source: str, runtime: str | None = None) -> dict[str, Any]:
    """Per prompt length: measured vs predicted decode tok/s, TTFT ms and peak MiB, and calibration rows;
    planned for ``runtime`` (the bundle's), by default the board's backend runtime."""
    runtime = runtime or board.backend_runtime
    try:
        mem_plan = _plan(spec, board, scheme, context, runtime)
    except EdgeInferError as e:
        return {"board": board.name, "skipped": f"cannot plan this bundle on {board.name}: {e.one_line()}"}
    bd = mem_plan.breakdown
    mem_pred = (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / MIB
    comparisons, rows = [], []
    for r in report["results"]:
        prompt, ctx = r["prompt_tokens"], min(context, r["prompt_tokens"] + r["new_tokens"])
        est = _plan(spec, board, scheme, ctx, runtime).estimates
        pre = est.prefill_tokens_per_s
        ttft_pred = prompt / pre * 1000 if pre else None
        mem = r["peak_rss_bytes"] / MIB if r.get("peak_rss_bytes") else None
        comparisons.append({
            "prompt_tokens": prompt, "ctx": ctx,
            "decode_tokens_per_s": r["decode_tokens_per_s"],
            "predicted_decode_tokens_per_s": est.decode_tokens_per_s,
            "decode_error_pct": _err(est.decode_tokens_per_s, r["decode_tokens_per_s"]),
            "ttft_ms": r["ttft_ms"], "predicted_ttft_ms": round(ttft_pred, 2) if ttft_pred else None,
            "ttft_error_pct": _err(ttft_pred, r["ttft_ms"]),
            "peak_mib": round(mem, 1) if mem else None, "predicted_peak_mib": round(mem_pred, 1),
            "peak_error_pct": _err(mem_pred, mem)})
        row = {"board": board.name, "runtime": mem_plan.runtime, "model": spec.name, "model_config": config,
               "quant": scheme, "prompt": prompt, "ctx": ctx, "decode": r["decode_tokens_per_s"],
               "ttft_ms": r["ttft_ms"], "source": source}
        if mem:
            row.update(mem_mib=round(mem, 1), mem_ctx=context)
        rows.append({k: v for k, v in row.items() if v is not None})
    basis = mem_plan.estimates.basis
    return {"board": board.name, "runtime": mem_plan.runtime, "scheme": scheme, "context": context,
            "speed_basis": basis, "comparisons": comparisons, "rows": rows,
            "notes": [] if mem_plan.estimates.decode_tokens_per_s is not None else
            [f"no decode prediction on {board.name} ({basis}): calibrate a profile with a bandwidth to compare"]}
