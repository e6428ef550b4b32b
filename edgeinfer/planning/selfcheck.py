"""The planner checks itself: an ``edgeinfer bench`` report of a decoder bundle against what ``plan``
predicts for the same board, model, scheme and context.

Decode is planned at prompt + new tokens (the KV the last step reads, as bench/data/measured_rows.yaml
counts ctx); TTFT as the plan's (t0 + prompt / its prefill rate); peak memory (weights + KV cache + activations +
runtime overhead, without the OS reserve) at the bundle's context, for which the KV cache is allocated, or,
where the runtime's KV cache is resident only as positions are written (onnxruntime), for the positions the run
wrote and the prompt it prefilled (``measured_run.held_by_run``). Each prompt length becomes a row `edgeinfer
calibrate` accepts.

Decode speed is compared only as what it is: a figure measured on the host CPU, in the rknn-toolkit2 simulator
or through a stand-in library is not a figure of the board, so its ratio to the board's prediction is reported
with where it ran and does not validate the board's speed constants (``board_figure`` false).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.contract.measure import busy_note
from edgeinfer.errors import EdgeInferError
from edgeinfer.planning import measured_run, planner, prefill
from edgeinfer.planning.boards import Board
from edgeinfer.planning.models.spec import ModelSpec

MIB = 2**20


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or not meas:
        return None
    return round((pred - meas) / meas * 100, 2)


def _plan(spec: ModelSpec, board: Board, scheme: str, ctx: int, runtime: str | None,
          paging: tuple[int, int] | None = None) -> planner.Plan:
    window, segments = paging or (None, None)
    return planner.plan(spec, board, quant=scheme, ctx=ctx, runtime=runtime, suggest=False, paging=window,
                        segments=segments)


def ran_on(device: str) -> str:
    """Where a measurement ran, from its decoder's device string: "stand-in library" (a library standing in
    for absent NPU hardware), "simulator", "host CPU" or "device"."""
    d = device.lower()
    for needle, where in (("stand-in", "stand-in library"), ("simulator", "simulator"), ("cpu", "host CPU")):
        if needle in d:
            return where
    return "device"


def is_board_figure(where: str, board: Board) -> bool:
    """Whether a figure measured ``where`` is one of ``board`` (the host's CPU is the ``host`` board's device)."""
    return where == "device" or (where == "host CPU" and board.family == "host")


def speed_label(device: str, board: Board, predicted: float | None, basis: str) -> dict[str, Any]:
    """Where a decode figure ran, whether it is the board's, and the one-line note that says what the
    comparison means."""
    where = ran_on(device)
    own = is_board_figure(where, board)
    if predicted is None:
        note = f"no decode prediction on {board.name} ({basis}): calibrate a profile with a bandwidth to compare"
    elif own:
        note = f"measured on {board.name}: the ratio checks the board's speed constants ({basis})"
    else:
        what = where if device.lower() == where.lower() else f"{where} ({device})"
        note = (f"a {what} figure, not one of {board.name}: its ratio to the board's prediction says nothing "
                "about the board's speed constants")
    return {"ran_on": where, "device": device, "board_figure": own, "note": note}


def ratio(measured: float | None, predicted: float | None) -> float | None:
    """measured / predicted, from the two figures as reported (rounded as they are)."""
    return round(measured / predicted, 4) if measured and predicted else None


def speed_check(measured: float | None, device: str, spec: ModelSpec, board: Board, scheme: str, ctx: int,
                runtime: str | None, measured_at: str, paging: tuple[int, int] | None = None,
                others_busy: float | None = None) -> dict[str, Any]:
    """Measured decode tok/s (``measured_at`` says of what) against the plan's prediction at ``ctx`` positions
    for ``board`` / ``runtime`` / ``scheme`` (and ``paging``: window, segments): deploy's ``speed_check``;
    ``others_busy``: the CPUs other work kept busy meanwhile (measure.others_busy_cpus), said where high."""
    try:
        est = _plan(spec, board, scheme, ctx, runtime or board.backend_runtime, paging).estimates
    except EdgeInferError as e:
        return {"board": board.name, "skipped": f"cannot plan this model on {board.name}: {e.one_line()}"}
    meas = round(measured, 2) if measured else None
    pred = round(est.decode_tokens_per_s, 2) if est.decode_tokens_per_s is not None else None
    out = {"board": board.name, "runtime": est.runtime, "scheme": scheme, "ctx": ctx, "measured_at": measured_at,
           "decode_tokens_per_s": meas, "predicted_decode_tokens_per_s": pred, "ratio": ratio(meas, pred),
           "speed_basis": est.basis, "others_busy_cpus": others_busy, **speed_label(device, board, pred, est.basis)}
    if busy := busy_note(others_busy):
        out["note"] += f"; {busy}"
    return out


def speed_line(sc: dict[str, Any]) -> str:
    """A :func:`speed_check` as one line of text."""
    if sc.get("skipped"):
        return f"decode speed vs plan: skipped ({sc['skipped']})"
    meas, pred = sc["decode_tokens_per_s"], sc["predicted_decode_tokens_per_s"]
    got = "-" if meas is None else f"{meas:.1f}"
    if pred is None:
        return f"decode {got} tok/s ({sc['measured_at']}); {sc['note']}"
    vs = f" = {sc['ratio']:.3g}× the prediction" if sc["ratio"] is not None else ""
    return (f"decode {got} tok/s vs {pred:.1f} predicted for {sc['board']} ({sc['runtime']} {sc['scheme']}, ctx "
            f"{sc['ctx']}){vs}; {sc['note']}")


def self_check(report: dict[str, Any], spec: ModelSpec, config: dict[str, Any] | None, board: Board, scheme: str,
               context: int, source: str, runtime: str | None = None,
               paging: tuple[int, int] | None = None) -> dict[str, Any]:
    """Per prompt length: measured vs predicted decode tok/s (and their ratio), TTFT ms and peak MiB, and
    calibration rows; planned for ``runtime`` (the bundle's), by default the board's backend runtime, and
    ``paging`` (window, segments) for a layer-paged bundle; labelled with where ``report`` ran
    (:func:`speed_label`)."""
    runtime = runtime or board.backend_runtime
    try:
        mem_plan = _plan(spec, board, scheme, context, runtime, paging)
    except EdgeInferError as e:
        return {"board": board.name, "skipped": f"cannot plan this bundle on {board.name}: {e.one_line()}"}
    bd = mem_plan.breakdown
    mem_pred = (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / MIB
    comparisons, rows = [], []
    for r in report["results"]:
        prompt, ctx = r["prompt_tokens"], min(context, r["prompt_tokens"] + r["new_tokens"])
        est = _plan(spec, board, scheme, ctx, runtime, paging).estimates
        ttft_pred = prefill.ttft_ms(est.prefill_t0_ms or 0.0, est.prefill_tokens_per_s, prompt) \
            if est.prefill_tokens_per_s else None
        mem = r["peak_rss_bytes"] / MIB if r.get("peak_rss_bytes") else None
        held = measured_run.held_by_run(mem_plan, prompt, ctx)
        peak_pred = held / MIB if held is not None else mem_pred
        comparisons.append({
            "prompt_tokens": prompt, "ctx": ctx,
            "decode_tokens_per_s": r["decode_tokens_per_s"],
            "predicted_decode_tokens_per_s": est.decode_tokens_per_s,
            "decode_error_pct": _err(est.decode_tokens_per_s, r["decode_tokens_per_s"]),
            "decode_ratio": ratio(r["decode_tokens_per_s"], est.decode_tokens_per_s),
            "ttft_ms": r["ttft_ms"], "predicted_ttft_ms": round(ttft_pred, 2) if ttft_pred else None,
            "ttft_error_pct": _err(ttft_pred, r["ttft_ms"]),
            "peak_mib": round(mem, 1) if mem else None, "predicted_peak_mib": round(peak_pred, 1),
            "peak_error_pct": _err(peak_pred, mem)})
        row = {"board": board.name, "runtime": mem_plan.runtime, "model_config": config,
               "model": spec.name if config is not None else spec.source,  # a file's rows: calibrate reads it
               "quant": scheme, "prompt": prompt, "ctx": ctx, "decode": r["decode_tokens_per_s"],
               "ttft_ms": r["ttft_ms"], "source": source}
        if mem:
            row.update(mem_mib=round(mem, 1), mem_ctx=context)
        rows.append({k: v for k, v in row.items() if v is not None})
    basis = mem_plan.estimates.basis
    label = speed_label(report.get("device") or "?", board, mem_plan.estimates.decode_tokens_per_s, basis)
    notes = [label.pop("note")]
    if not label["board_figure"]:  # a host or simulator figure would calibrate the board's constants wrongly
        rows = []
        notes.append(f"no calibration rows: these figures are not {board.name}'s")
    return {"board": board.name, "runtime": mem_plan.runtime, "scheme": scheme, "context": context,
            "speed_basis": basis, "comparisons": comparisons, "rows": rows, **label, "notes": notes}
