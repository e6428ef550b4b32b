"""The planner's paging cost model (docs/paging.md): resident memory with W segments resident, and
decode / prefill estimates when every non-resident byte is streamed from storage once per token."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from edgeinfer.contract.schedule import simulate
from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.planning import decoder_segments as ds
from edgeinfer.planning.boards import GIB
from edgeinfer.planning.details import PAGED_RATES, PagingCost

# storage read bandwidth assumed when a board profile gives none (interface maxima: optimistic)
STORAGE_GBPS = {
    "dram": (None, "page cache in DRAM: the board's memory bandwidth"),
    "nvme": (3.94, "PCIe 3.0 x4 interface maximum (RK3588 has PCIe 3.0 x4); real drives reach less"),
    "emmc": (0.40, "eMMC 5.1 HS400 interface maximum (400 MB/s); real parts read 250-330 MB/s"),
    "sd": (0.104, "SD UHS-I SDR104 interface maximum (104 MB/s)"),
}
_LAYER_KEY = re.compile(r"(?:layers?|blk|h|block)\.(\d+)\.")


def layer_bytes(spec: Any, weights_total: int) -> tuple[list[int], int]:
    """Bytes per layer and the bytes outside the layers (embeddings, final norm, head).

    Exact per-tensor bytes when the model file gave them and ``weights_total`` matches them;
    otherwise the body is shared equally among ``spec.layers``."""
    layers = max(int(getattr(spec, "layers", 0) or 0), 1)
    tb = getattr(spec, "tensor_bytes", None) or {}
    if tb and abs(sum(tb.values()) - weights_total) <= 0.01 * max(weights_total, 1):
        per = [0] * layers
        rest = 0
        for name, b in tb.items():
            m = _LAYER_KEY.search(name)
            if m and int(m.group(1)) < layers:
                per[int(m.group(1))] += b
            else:
                rest += b
        if sum(per):
            return per, weights_total - sum(per)
    emb = int(getattr(spec, "embedding_params", 0) or 0)
    head = 0 if getattr(spec, "tied_embeddings", False) or getattr(spec, "encoder", False) else int(
        getattr(spec, "lm_head_params", 0) or 0)
    total_p = int(getattr(spec, "params_total", 0) or 0)
    outside = int(weights_total * (emb + head) / total_p) if total_p else 0
    body = weights_total - outside
    return [body // layers] * layers, outside


def segment_bytes_from_layers(per_layer: Sequence[int], outside: int, segments: int) -> list[int]:
    """Group layers contiguously (as :func:`split_onnx` does) and put the non-layer bytes half in
    the first segment (embeddings) and half in the last (final norm, head)."""
    n_l = len(per_layer)
    segments = max(1, min(segments, n_l))
    seg = [0] * segments
    for b, x in enumerate(per_layer):
        seg[b * segments // n_l] += x
    seg[0] += outside // 2
    seg[-1] += outside - outside // 2
    return seg


def plan_paging(
    segment_bytes: Sequence[int],
    window: int,
    *,
    other_resident_bytes: int = 0,
    segment_buffer_bytes: int = 0,
    capacity_bytes: int | None = None,
    npu_window_bytes: int | None = None,
    storage_gbps: float | None = None,
    storage_source: str = "",
    compute_s_per_token: float | None = None,
    prefill_s_per_token: float | None = None,
    prompt_tokens: int = 0,
    batch: int = 1,
    prefetch: bool = True,
    resident_prefix: int | None = None,
    init_s_per_segment: float = 0.0,
    shared_bus: bool = False,
    prefill_chunk: int | None = None,
) -> dict[str, Any]:
    """The paging cost model (docs/paging.md).

    Resident = the peak bytes of the ``window`` segments the schedule keeps (see :func:`simulate`)
    + ``segment_buffer_bytes`` for each of them (every loaded runtime instance allocates its own
    activation buffers: docs/paging.md, measured) + ``other_resident_bytes`` (KV cache, runtime, OS).
    Per decode step the schedule pages in ``steady_bytes`` (every non-resident byte, once per token)
    at ``storage_gbps``;
    prefetch overlaps that with compute only when a segment's compute takes at least as long as
    its load: step = max(compute, stream) with prefetch, compute + stream without. With
    ``shared_bus`` (weights paged from DRAM into the NPU's buffers) the copy reads and writes the
    same memory the compute is reading: twice the bytes, and no overlap. Prefill streams the
    bytes once per pass (one pass per ``prefill_chunk`` tokens of the prompt).
    """
    n = len(segment_bytes)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InputError(f"--paging must be a positive window size (segments resident), got {window!r}")
    w = min(window, n)
    sim = simulate(segment_bytes, w, prefetch, resident_prefix)
    stream = sim["steady_bytes"]
    resident_w = sim["peak_resident_bytes"]
    buffers = segment_buffer_bytes * sim["peak_resident_segments"]
    out: dict[str, Any] = {
        "window": window, "segments": n, "segment_bytes": list(segment_bytes),
        "largest_segment_bytes": max(segment_bytes) if n else 0,
        "resident_weight_bytes": resident_w, "resident_total_bytes": resident_w + buffers + other_resident_bytes,
        "resident_instances": sim["peak_resident_segments"], "segment_buffer_bytes": segment_buffer_bytes,
        "buffer_bytes": buffers,
        "streamed_bytes_per_token": stream, "loads_per_token": len(sim["steady_loads"]),
        "prefetch": sim["prefetch_effective"], "storage_gbps": storage_gbps, "storage_source": storage_source,
        "fits": None, "reasons": [], "npu_window_ok": None,
    }
    if capacity_bytes is not None:
        out["fits"] = out["resident_total_bytes"] <= capacity_bytes
        if not out["fits"]:
            out["reasons"].append(f"{w} resident segment(s) + the rest need "
                                  f"{out['resident_total_bytes'] / 2**30:.2f} GiB, more than the board's "
                                  f"{capacity_bytes / 2**30:.2f} GiB; use a smaller window "
                                  "or more segments")
    if npu_window_bytes is not None:
        out["npu_window_bytes"] = npu_window_bytes
        out["npu_window_ok"] = resident_w <= npu_window_bytes
        if not out["npu_window_ok"]:
            out["reasons"].append(npu_window_reason(resident_w, npu_window_bytes))
            out["fits"] = False
    if storage_gbps:
        load_s = (2 if shared_bus else 1) * stream / (storage_gbps * 1e9)
        load_s += init_s_per_segment * len(sim["steady_loads"])
        overlap = out["prefetch"] and not shared_bus
        out["stream_s_per_token"] = load_s
        out["shared_bus"] = shared_bus
        if compute_s_per_token is not None:
            step = max(compute_s_per_token, load_s) if overlap else compute_s_per_token + load_s
            out["compute_s_per_token"] = compute_s_per_token
            out["decode_tokens_per_s"] = round(batch / step, 4) if step > 0 else None
            out["bound"] = "storage" if load_s > compute_s_per_token else "compute"
            hidden = min(load_s, compute_s_per_token) if overlap else 0.0
            out["load_hidden_fraction"] = round(hidden / load_s, 4) if load_s > 0 else 1.0
        if prefill_s_per_token is not None and prompt_tokens:
            passes = -(-prompt_tokens // prefill_chunk) if prefill_chunk else 1
            comp = prefill_s_per_token * prompt_tokens
            total = max(comp, passes * load_s) if overlap else comp + passes * load_s
            out["prefill_passes"] = passes
            out["prefill_tokens_per_s"] = round(prompt_tokens / total, 2) if total > 0 else None
    return out


def npu_window_reason(resident_bytes: int, npu_window_bytes: int) -> str:
    return (f"the resident window ({resident_bytes / 2**30:.2f} GiB) exceeds one {npu_window_bytes / 2**30:g} GiB "
            "NPU IOMMU window; use a smaller window or more segments")


def _storage(board: Any, storage: str | None) -> tuple[float | None, str, str]:
    if storage is None:
        storage = "board" if getattr(board, "storage_gbps", None) else "emmc"
    if storage == "board":
        if not getattr(board, "storage_gbps", None):
            raise InputError(f"board {board.name} gives no storage bandwidth; pass --storage nvme|emmc|sd|dram")
        return board.storage_gbps.value, storage, board.storage_gbps.source
    if storage == "dram":
        gbps = board.bandwidth_gbps.value if getattr(board, "bandwidth_gbps", None) else None
        return gbps, storage, STORAGE_GBPS["dram"][1]
    if storage in STORAGE_GBPS:
        gbps, src = STORAGE_GBPS[storage]
        return gbps, storage, src
    raise InputError(f"unknown storage {storage!r}; use one of: board, {', '.join(STORAGE_GBPS)}")


def unpaged_weight_bytes(p: Any) -> int:
    """All the weights of plan ``p``, also when it is already paged (its breakdown holds the resident ones)."""
    unpaged = p.details.weights.total_bytes_unpaged
    return p.breakdown["weights"] if unpaged is None else unpaged


def _plan_segments(p: Any, segments: int | None) -> list[int]:
    spec = p.model
    weights = int(unpaged_weight_bytes(p))
    if not getattr(spec, "layers", 0) and not segments:
        raise InputError(f"the layer count of {spec.name} is unknown (an ONNX file gives none); pass --segments N")
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int) or segments < 1):
        raise InputError(f"--segments must be a positive integer, got {segments!r}")
    per_layer, outside = layer_bytes(spec, weights)
    if not getattr(spec, "layers", 0):
        per_layer, outside = [weights // segments] * segments, weights - weights // segments * segments
    return segment_bytes_from_layers(per_layer, outside, segments or len(per_layer))


def npu_window_bytes(board: Any) -> int | None:
    """The largest contiguous NPU buffer of ``board`` (``npu_window_gib``), or None where it states none."""
    return int(board.npu_window_gib.value * 2**30) if getattr(board, "npu_window_gib", None) else None


def _paging_inputs(p: Any, storage: str | None, prefill_chunk: int) -> dict[str, Any]:
    board, est = p.board, p.estimates
    gbps, name, src = _storage(board, storage)
    npu = npu_window_bytes(board)
    return {
        "capacity_bytes": p.capacity_bytes, "npu_window_bytes": npu, "storage_gbps": gbps,
        "storage_source": f"{name}: {src}",
        "compute_s_per_token": p.batch / est.decode_tokens_per_s if est.decode_tokens_per_s else None,
        "prefill_s_per_token": 1 / est.prefill_tokens_per_s if est.prefill_tokens_per_s else None,
        "prompt_tokens": p.ctx, "batch": p.batch, "shared_bus": name == "dram",
        "prefill_chunk": None if p.model.encoder else prefill_chunk,
    }


def _resident_parts(p: Any) -> dict[str, int]:
    """What stays resident besides the weights: the plan's activations once per resident segment
    (each segment is its own runtime instance with its own buffers), everything else once."""
    act = int(p.breakdown.get("activations", 0))
    other = sum(v for k, v in p.breakdown.items() if k not in ("weights", "activations"))
    return {"other_resident_bytes": other, "segment_buffer_bytes": act}


@dataclass
class PagedPlan:
    """The paging cost model's answer for one plan; :func:`merge` makes the plan its paged form."""

    cost: PagingCost  # plan_paging's result + "storage": the plan's details.paging
    resident_segments: int  # min(window, segments)
    segments: int
    unpaged_weight_bytes: int
    npu_reasons: list[str] = field(default_factory=list)  # the resident window exceeds one NPU window

    @property
    def resident_weight_bytes(self) -> int:
        return int(self.cost.resident_weight_bytes)


@dataclass
class Verdict:
    """The unpaged verdict without what paging changes (the memory reason, the weights-window warning)."""

    reasons_but_memory: list[str]
    warnings_but_weights_window: list[str]


def merge(p: Any, r: PagedPlan, unpaged: Verdict) -> None:
    """Turn planner ``Plan`` ``p`` into its paged form: resident weights in the breakdown, the verdict on the
    resident total and the NPU window (paging answers the weights-window warning), paged speed estimates."""
    res = r.cost
    p.details.paging = res
    p.details.weights.total_bytes_unpaged = r.unpaged_weight_bytes
    p.details.weights.paged = f"{r.resident_segments} of {r.segments} segments resident"
    p.breakdown["weights"] = r.resident_weight_bytes
    if res.rule != "decoder":  # a decoder's runtime keeps one set of buffers however many segments load
        p.breakdown["activations"] = int(res.buffer_bytes)  # each resident segment's own (docs/paging.md)
    p.reasons = list(unpaged.reasons_but_memory)
    if p.total_bytes > p.capacity_bytes:
        p.reasons.append(f"needs {p.total_bytes / GIB:.2f} GiB with {r.resident_segments} segment(s) resident, "
                         f"the board has {p.capacity_bytes / GIB:.2f} GiB; use a smaller --paging window")
    p.reasons += r.npu_reasons
    p.warnings = list(unpaged.warnings_but_weights_window)
    p.fits = not p.reasons
    paged = [k for k in PAGED_RATES if getattr(res, k) is not None]
    p.estimates = replace(p.estimates, paging=res, **{f"{k}_unpaged": getattr(p.estimates, k) for k in paged},
                          **{k: getattr(res, k) for k in paged})


# prefill chunks a suggestion tries, and how close to the unpaged prefill rate ends the search
CHUNKS = (32, 64, 128, 256, 512)
CLOSE = 0.95
BETTER = 1.2  # a suggestion at least this much faster than the plan's own prefill


def larger_chunk(p: Any, plan: Any) -> dict[str, Any] | None:
    """For a layer-paged decoder plan ``p`` whose prefill pages every segment in once per chunk: the smallest
    larger prefill chunk (of :data:`CHUNKS`, at most the context) that brings prefill within 5 % of the unpaged
    rate, else the fastest that fits; None when none is ≥ 1.2× the plan's. ``plan`` is the planner's (it
    imports this module)."""
    c = p.details.paging
    own, unpaged = p.estimates.prefill_tokens_per_s, p.estimates.prefill_tokens_per_s_unpaged
    if c is None or c.rule != "decoder" or not own or not unpaged or own >= CLOSE * unpaged:
        return None
    best = None
    for n in (n for n in CHUNKS if p.chunk < n <= p.ctx):
        alt = plan(p.model, p.board, quant=p.scheme.name, ctx=p.ctx, batch=p.batch, kv_dtype=p.kv_dtype,
                   runtime=p.runtime, paging=c.window, segments=c.segments, storage=c.storage, suggest=False,
                   prefill_chunk=n)
        rate = alt.estimates.prefill_tokens_per_s
        if not alt.fits or not rate:
            break
        if best is None or rate > best["prefill_tokens_per_s"]:
            best = {"prefill_chunk": n, "prefill_tokens_per_s": rate, "speedup": round(rate / own, 2),
                    "activations_bytes": alt.breakdown["activations"], "total_bytes": alt.total_bytes}
        if rate >= CLOSE * unpaged:
            break
    return best if best and best["prefill_tokens_per_s"] >= BETTER * own else None


def paged_plan(p: Any, window: int, segments: int | None, storage: str | None, prefill_chunk: int) -> PagedPlan:
    """The paged form of a planner ``Plan`` (not modified): weights become the resident window, the
    NPU window is checked against it, estimates get the streamed bytes."""
    if pages_decoder(p):
        return decoder_paged_plan(p, window, segments, storage, prefill_chunk)
    rt = paged_runtime(p.board, p.model, window)
    if rt and p.runtime != rt:
        raise InputError(f"{p.runtime} runs whole models: layer paging of a decoder is planned on {rt}",
                         f"drop --runtime {p.runtime}, or pass --runtime {rt}")
    seg = _plan_segments(p, segments)
    inputs = _paging_inputs(p, storage, prefill_chunk)
    res = plan_paging(seg, window, **_resident_parts(p), **inputs)
    res["storage"] = res["storage_source"].split(":")[0]
    npu = [npu_window_reason(res["resident_weight_bytes"], inputs["npu_window_bytes"])] \
        if res.get("npu_window_ok") is False else []
    return PagedPlan(cost=PagingCost.from_dict(res), resident_segments=min(window, len(seg)), segments=len(seg),
                     unpaged_weight_bytes=int(p.breakdown["weights"]), npu_reasons=npu)


def paging_need(p: Any) -> str | None:
    """Why unpaged plan ``p`` needs layer paging: its total does not fit the board's memory, or its weights
    do not fit one NPU IOMMU window; None when neither (or ``p`` is already paged)."""
    if p.details.paging is not None:
        return None
    if p.total_bytes > p.capacity_bytes:
        return (f"needs {p.total_bytes / 2**30:.2f} GiB unpaged, the board has {p.capacity_bytes / 2**30:.2f} GiB")
    win = getattr(p.board, "npu_window_gib", None)
    if win and p.breakdown["weights"] > win.value * 2**30:
        return f"the weights ({p.breakdown['weights'] / 2**30:.2f} GiB) exceed one {win.value:g} GiB NPU IOMMU window"
    return None


def suggest_window(p: Any, prefill_chunk: int, segments: int | None = None, storage: str | None = None
                   ) -> dict[str, Any] | None:
    """The largest paging window (fastest) whose resident memory fits the board and, where the
    board has one, the NPU window; None when the layers are unknown or even W=1 does not fit."""
    if pages_decoder(p, any_runtime=True):
        return _suggest_decoder_window(p, prefill_chunk, segments, storage) if backend_pages_decoders(p) else None
    if not getattr(p.model, "encoder", True):  # a decoder pages by the decoder rule alone (deploy builds no other)
        return None
    try:
        seg = _plan_segments(p, segments)
        inputs = _paging_inputs(p, storage, prefill_chunk)
    except EdgeInferError:
        return None
    weights = int(unpaged_weight_bytes(p))
    for w in range(len(seg), 0, -1):
        res = plan_paging(seg, w, **_resident_parts(p), **inputs)
        if res["fits"] is not False:
            if w == len(seg) and res["resident_weight_bytes"] >= weights and not p.fits:
                continue  # everything resident is the unpaged plan, which does not fit
            return {"window": w, "segments": len(seg), "resident_total_bytes": res["resident_total_bytes"],
                    "streamed_bytes_per_token": res["streamed_bytes_per_token"],
                    "decode_tokens_per_s": res.get("decode_tokens_per_s"), "storage": res["storage_source"]}
    return None


# --------------------------------------------------------------------------- decoders (decoder_segments.py)
def backend_pages_decoders(p: Any) -> bool:
    """Whether deploy can build ``p``'s decoder paged: the board's backend converts decoder segments and loads a
    window (edgeinfer/deploy/decoder_paging.py refuses ``--paging`` otherwise). A backend not installed here is
    planned as its board declares it."""
    from edgeinfer.contract import registry  # the backend's module only, no SDK (test_light_core)

    entry = registry.registry().backend(p.board.backend)
    return entry is None or entry.cls.decoders.pages


def paged_runtime(board: Any, spec: Any, paging: int | None) -> str | None:
    """The runtime a paged decoder is planned on: edgeinfer's own backend runtime on the board (the
    vendor's LLM runtimes run whole models), when it takes decoders; None leaves the choice as it is."""
    rt = getattr(board, "backend_runtime", None)
    if paging is None or getattr(spec, "encoder", True) or not rt or "decoder" not in board.runtimes[rt].kinds:
        return None
    return rt


def pages_decoder(p: Any, any_runtime: bool = False) -> bool:
    """Whether the decoder rule applies: a dense decoder planned on the board's backend runtime
    (``any_runtime``: or on another runtime, when the backend runtime would take it paged)."""
    rt = p.board.backend_runtime
    if not rt:
        return False
    on_backend = p.runtime == rt or (any_runtime and paged_runtime(p.board, p.model, 1) == rt
                                     and p.scheme.name in p.board.runtimes[rt].schemes)
    return bool(on_backend and ds.pageable(p.model))


def _decoder_segments(p: Any, segments: int | None) -> list[int]:
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int) or segments < 1):
        raise InputError(f"--segments must be a positive integer, got {segments!r}")
    n = min(segments or p.model.layers, p.model.layers)
    return ds.segment_bytes(p.model, p.scheme, n)


def decoder_paging_cost(p: Any, seg: list[int], window: int | None, storage: str | None,
                        prefill_chunk: int) -> dict[str, Any]:
    """The decoder rule's cost for plan ``p`` (unpaged: ``window`` None): resident and paged-in bytes,
    where the page-in comes from (DRAM when the whole model fits the board, else storage), compute
    from the plan's speed constants on the exact segment bytes, and what paging costs in tokens/s."""
    host = ds.host_bytes(p.model)
    other = sum(v for k, v in p.breakdown.items() if k != "weights")
    if storage is None and sum(seg) + host + other <= p.capacity_bytes:
        storage = "dram"
    gbps, name, src = _storage(p.board, storage)
    shared = name == "dram"
    prefetch = not shared  # the runtime prefetches from storage; a DRAM copy shares compute's bus
    npu_res = ds.resident_bytes(seg, window, prefetch)
    paged = ds.paged_in_bytes(seg, window, prefetch)
    est = p.estimates
    kv_read = est.kv_bytes_per_token_at_ctx or 0
    bw_eff = est.bw_fraction * est.bandwidth_gbps * 1e9 if est.bw_fraction else None
    compute = est.t0_ms / 1000 + (sum(seg) + kv_read) / bw_eff if bw_eff and est.t0_ms is not None else None
    page_in = ds.page_in_seconds(paged, gbps, shared)
    npu = npu_window_bytes(p.board)
    out: dict[str, Any] = {
        "rule": "decoder", "window": window, "segments": len(seg), "segment_bytes": list(seg),
        "largest_segment_bytes": max(seg), "npu_resident_bytes": npu_res, "host_weight_bytes": host,
        "resident_weight_bytes": npu_res + host, "resident_total_bytes": npu_res + host + other,
        "kv_bytes": p.breakdown["kv_cache"], "streamed_bytes_per_token": paged,
        "loads_per_token": ds.paged_in_loads(seg, window, prefetch), "prefetch": bool(paged) and prefetch,
        "storage": name, "storage_gbps": gbps, "storage_source": f"{name}: {src}", "shared_bus": shared,
        "stream_s_per_token": page_in, "compute_s_per_token": compute, "npu_window_bytes": npu,
        "npu_window_ok": None if npu is None else npu_res <= npu, "fits": None, "reasons": [],
    }
    out["fits"] = out["resident_total_bytes"] <= p.capacity_bytes and out["npu_window_ok"] is not False
    if out["npu_window_ok"] is False:
        out["reasons"].append(npu_window_reason(npu_res, npu))
    if compute is not None and page_in is not None:
        step = ds.step_seconds(compute, page_in, shared)
        out.update(decode_tokens_per_s=p.batch / step, decode_tokens_per_s_unpaged=p.batch / compute,
                   bound="compute" if page_in <= compute else ("storage" if not shared else "page-in copy"),
                   load_hidden_fraction=round(min(page_in, compute) / page_in, 4) if page_in and not shared else
                   (1.0 if not page_in else 0.0))
        out["paged_cost_tokens_per_s"] = out["decode_tokens_per_s_unpaged"] - out["decode_tokens_per_s"]
        out["paged_cost_pct"] = (1 - compute / step) * 100
        if est.prefill_tokens_per_s:
            passes = -(-p.ctx // prefill_chunk)
            total = ds.step_seconds(p.ctx / est.prefill_tokens_per_s, passes * page_in, shared)
            out.update(prefill_passes=passes, prefill_tokens_per_s=round(p.ctx / total, 2))
    return out


def decoder_paged_plan(p: Any, window: int, segments: int | None, storage: str | None,
                       prefill_chunk: int) -> PagedPlan:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InputError(f"--paging must be a positive window size (segments resident), got {window!r}")
    seg = _decoder_segments(p, segments)
    res = decoder_paging_cost(p, seg, window, storage, prefill_chunk)
    return PagedPlan(cost=PagingCost.from_dict(res), resident_segments=min(window, len(seg)), segments=len(seg),
                     unpaged_weight_bytes=int(p.breakdown["weights"]), npu_reasons=list(res["reasons"]))


def _suggest_decoder_window(p: Any, prefill_chunk: int, segments: int | None, storage: str | None
                            ) -> dict[str, Any] | None:
    try:
        seg = _decoder_segments(p, segments)
        rest = ds.host_bytes(p.model) + sum(v for k, v in p.breakdown.items() if k != "weights")
        npu = npu_window_bytes(p.board)
        for w in range(len(seg) - 1, 0, -1):
            floor = ds.resident_floor(seg, w)
            if floor + rest > p.capacity_bytes or (npu is not None and floor > npu):
                continue  # too big for the board or its NPU window whatever the schedule: no replay needed
            res = decoder_paging_cost(p, seg, w, storage, prefill_chunk)
            if res["fits"]:
                return {"window": w, "segments": len(seg), "resident_total_bytes": res["resident_total_bytes"],
                        "npu_resident_bytes": res["npu_resident_bytes"],
                        "streamed_bytes_per_token": res["streamed_bytes_per_token"],
                        "decode_tokens_per_s": res.get("decode_tokens_per_s"),
                        "decode_tokens_per_s_unpaged": res.get("decode_tokens_per_s_unpaged"),
                        "paged_cost_pct": res.get("paged_cost_pct"), "storage": res["storage_source"]}
    except EdgeInferError:
        return None
    return None
