"""Layer-paged decoder bundles (``deploy --paging``) at load: the window they run with, and what the plan
predicts for it (docs/paging.md#decoders).

A paged bundle's manifest records its segments and window (``decoder.paging``); it loads with that window
unless the caller passes another (``--window W``): 1..segments, and only one whose resident segments the
board's memory holds per the plan (the same plan ``deploy --paging W`` refuses by).
"""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import InputError
from edgeinfer.model import decoder_bundle
from edgeinfer.model.bundle import Bundle

# the plan's paging figures a paged decoder bundle records and bench compares (planning.details.PagingCost)
PREDICTED = ("window", "segments", "segment_bytes", "npu_resident_bytes", "resident_total_bytes",
             "streamed_bytes_per_token", "loads_per_token", "storage", "decode_tokens_per_s",
             "decode_tokens_per_s_unpaged", "paged_cost_pct")


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
    n = paging["segments"]
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= n:
        raise InputError(f"--window {window}: bundle {bundle.path} has {n} segments; pass a window of 1..{n}")
    p = plan(bundle, window, ctx)
    if not p.fits:
        raise InputError(f"--window {window} does not fit board {bundle.manifest.board}: {'; '.join(p.reasons)}; "
                         f"pass --window {paging['window']} (the bundle's) or less")
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
    """The plan's paging figures for ``bundle`` at ``window``: what ``bench`` puts next to the measured ones."""
    return figures(plan(bundle, window, ctx).details.paging)


def figures(cost: Any) -> dict[str, Any]:
    """The :data:`PREDICTED` figures of a plan's paging cost (``Plan.details.paging``)."""
    return {k: list(v) if isinstance(v, tuple) else v for k in PREDICTED for v in [getattr(cost, k)]}
