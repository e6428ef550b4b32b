"""What layer paging costs a decoder on a board: :func:`plan_paged_decoder` (docs/paging.md#decoders),
and the paging ``auto`` picks for a plan: :func:`choose`.

The segment rule and the cost arithmetic are in :mod:`edgeinfer.planning.decoder_segments`; this
module plans the model on the board's own backend runtime (the runtime edgeinfer pages) and reads
the paged figures back, so the numbers are those ``edgeinfer plan --paging W`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import InputError
from edgeinfer.planning import decoder_segments as ds
from edgeinfer.planning.boards import get_board
from edgeinfer.planning.models import resolve
from edgeinfer.planning.paging import decoder_paging_cost, paging_need, suggest_window
from edgeinfer.planning.planner import plan


@dataclass(frozen=True)
class PagedDecoderPlan:
    window: int  # segments resident (== segments when unpaged)
    segments: int
    segment_bytes: tuple[int, ...]  # weight bytes of each segment (embedding on the host: in none)
    resident_bytes: int  # peak bytes of the W consecutive resident segments
    kv_bytes: int  # the planner's KV cache at the context
    page_in_s_per_token: float  # every segment paged in once per token when W < S; 0 unpaged
    compute_s_per_token: float  # t0 + (segment bytes + KV read) / effective bandwidth
    tokens_per_s: float  # decode, paged
    paged_cost_pct: float  # tokens/s lost to paging, % of the unpaged figure


def plan_paged_decoder(model: Any, board: Any, *, scheme: str, context: int, window: int | None,
                       segments: int, storage: str | None = None) -> PagedDecoderPlan:
    """Plan ``model`` split into ``segments`` with ``window`` of them resident (None: all resident)
    on ``board``'s backend runtime; the page-in source is DRAM when the whole model fits the board,
    else ``storage`` (board, nvme, emmc, sd; default: the board's, else eMMC)."""
    spec = resolve(model)
    b = get_board(board)
    rt = b.backend_runtime
    if not ds.pageable(spec):
        raise InputError(f"{spec.name}: layer paging plans dense decoders (layers alike, a KV cache)")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= spec.layers:
        raise InputError(f"segments must be 1..{spec.layers} (the layers of {spec.name}), got {segments!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise InputError(f"window must be a positive number of segments or None, got {window!r}")
    if not rt or "decoder" not in b.runtimes[rt].kinds:
        raise InputError(f"board {b.name} has no backend runtime that runs decoders")
    p = plan(spec, b, quant=scheme, ctx=context, runtime=rt, suggest=False)
    seg = ds.segment_bytes(spec, p.scheme, segments)
    cost = decoder_paging_cost(p, seg, window, storage, p.chunk)
    if cost.get("decode_tokens_per_s") is None:
        raise InputError(f"no speed model for {rt}/{p.scheme.name} on {b.name}: {p.estimates.basis}")
    return PagedDecoderPlan(
        window=min(window or segments, segments), segments=segments, segment_bytes=tuple(seg),
        resident_bytes=cost["npu_resident_bytes"], kv_bytes=cost["kv_bytes"],
        page_in_s_per_token=cost["stream_s_per_token"], compute_s_per_token=cost["compute_s_per_token"],
        tokens_per_s=cost["decode_tokens_per_s"], paged_cost_pct=cost["paged_cost_pct"])


def choose(p: Any, segments: int | None = None) -> tuple[int, int] | None:
    """The paging that ``--paging auto`` builds for unpaged decoder plan ``p``: (window, segments), the
    largest window of ``segments`` (default: one per layer) that fits the board and one NPU window, when the
    plan needs paging (:func:`edgeinfer.planning.paging.paging_need`); None when it needs none, or when
    no window fits (the plan's own verdict stands then)."""
    if paging_need(p) is None:
        return None
    s = suggest_window(p, p.chunk, segments)
    return None if s is None else (s["window"], s["segments"])
