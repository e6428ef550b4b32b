"""Layer-paged decoder bundles (``deploy --paging``) at load: the window they run with, and what the plan
predicts for it (docs/paging.md#decoders).

A paged bundle's manifest records its segments and window (``decoder.paging``); it loads with that window
unless the caller passes another (``--window W``): 1..segments, and at most the largest window whose
resident segments the board holds per the plan (recorded at deploy as ``max_window``: the plan
``deploy --paging W`` refuses by).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.model import decoder_bundle
from edgeinfer.model.bundle import Bundle
from edgeinfer.model.kind import Kind

# the plan's paging figures a paged decoder bundle records and bench compares (planning.details.PagingCost)
PREDICTED = ("window", "segments", "segment_bytes", "npu_resident_bytes", "resident_total_bytes",
             "streamed_bytes_per_token", "loads_per_token", "storage", "decode_tokens_per_s",
             "decode_tokens_per_s_unpaged", "paged_cost_pct")


def window_option(path: Any, found: Kind, window: int | None) -> dict[str, Any]:
    """``--window`` as a load option: only a decoder bundle takes it (checked at load: :func:`load_window`)."""
    if window is None:
        return {}
    if found is not Kind.DECODER_BUNDLE:
        raise InputError(f"--window applies to layer-paged decoder bundles (deployed with --paging); {path} is "
                         "not a decoder bundle: drop --window")
    return {"window": window}


def load_window(bundle: Bundle, window: Any, ctx: int) -> dict[str, Any]:
    """The load options for ``bundle``'s paging: ``{"window": W}`` (the recorded window, or ``window`` once
    checked), ``{}`` for an unpaged bundle (which refuses a ``window``)."""
    paging = bundle.manifest.decoder.get("paging")
    if paging is None:
        if window is not None:
            raise InputError(f"--window applies to layer-paged decoder bundles (deployed with --paging); bundle "
                             f"{bundle.path} is not one: drop --window")
        return {}
    if window is None or window == paging["window"]:
        return {"window": paging["window"]}
    n, largest = paging["segments"], paging.get("max_window")
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= n:
        raise InputError(f"--window {window}: bundle {bundle.path} has {n} segments; pass a window of 1..{n}")
    if largest is not None and window > largest:
        raise InputError(f"--window {window}: {window} of {n} segments resident do not fit board "
                         f"{bundle.manifest.board} per its plan (memory or one NPU window); pass --window {largest} "
                         "or less")
    return {"window": window}


def plan(bundle: Bundle, window: int, ctx: int) -> Any:
    """The plan of ``bundle``'s model on its board with ``window`` of its segments resident."""
    from edgeinfer.contract import seal
    from edgeinfer.planning.planner import plan as make_plan

    m = bundle.manifest
    config_dir = seal.contained(bundle.path, m.decoder.get("tokenizer", decoder_bundle.TOKENIZER),
                                "decoder.tokenizer")
    return make_plan(str(config_dir), m.board, quant=m.scheme, ctx=ctx, runtime=m.decoder.get("runtime"),
                     paging=window, segments=m.decoder["paging"]["segments"], suggest=False)


def predicted(bundle: Bundle, window: int, ctx: int) -> dict[str, Any]:
    """The plan's paging figures for ``bundle`` at ``window``: what ``bench`` puts next to the measured ones
    (those recorded at deploy for the bundle's own window and context)."""
    paging = bundle.manifest.decoder["paging"]
    if paging.get("predicted") and window == paging["window"] and ctx == bundle.manifest.decoder["context"]:
        return dict(paging["predicted"])
    return figures(plan(bundle, window, ctx).details.paging)


def figures(cost: Any) -> dict[str, Any]:
    """The :data:`PREDICTED` figures of a plan's paging cost (``Plan.details.paging``)."""
    return {k: list(v) if isinstance(v, tuple) else v for k in PREDICTED for v in [getattr(cost, k)]}


def bench_report(bundle: Bundle, decoder: Any, before: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """What a paged bundle's ``bench`` adds (``report``: the decoder bench's): page-ins per generated token
    during the benchmark, page-in time per segment, and the measured resident weight bytes next to the plan's."""
    after = decoder.paging_stats()
    tokens = sum((report["warmup"] + report["repeat"]) * row["new_tokens"] for row in report["results"])
    page_ins = after["page_ins"] - before["page_ins"]
    notes = list(after.get("notes", []))
    try:
        pred = predicted(bundle, after["window"], report["context"])
    except EdgeInferError as e:  # a board given as a file at deploy is not known here by its name
        pred = None
        notes.append(f"no plan prediction for window {after['window']}: {e.one_line()}")
    measured, want = after["peak_resident_bytes"], pred and pred["npu_resident_bytes"]
    return {
        "segments": after["segments"], "window": after["window"], "prefetch": after["prefetch"],
        "page_ins": page_ins, "generated_tokens": tokens, "page_ins_per_token": page_ins / tokens if tokens else None,
        "page_in_ms_mean": after["page_in_ms_mean"], "segment_bytes": after["segment_bytes"],
        "measured_resident_bytes": measured, "predicted_resident_bytes": want,
        "resident_error_pct": (want - measured) / measured * 100 if measured and want is not None else None,
        "predicted": pred, "notes": notes,
    }
