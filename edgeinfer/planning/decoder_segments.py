"""Segments of a layer-paged decoder and the cost of paging them (docs/paging.md#decoders).

The rule shared with the backend that pages decoders (the RKNN plugin, issue 17):

* the decoder layers are split into S contiguous groups with ``numpy.array_split`` semantics
  (the first ``L mod S`` groups get one layer more);
* the token-embedding table stays on the host, in no segment;
* the final norm and the lm_head belong to the last segment (the lm_head is counted even when
  tied: the NPU graph holds its own copy);
* a window of W segments is resident, kept by the paging schedule the runtime itself follows
  (``edgeinfer.contract.schedule``): the first W−1 segments pinned (W−2 with prefetch), the others
  streamed through the remaining slot(s), so each token pages in the S − pinned unpinned segments.

Pure arithmetic on a :class:`ModelSpec`: no planner import (the planner imports this module).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from edgeinfer.contract.schedule import Schedule, simulate
from edgeinfer.contract.schemes import Scheme
from edgeinfer.planning.details import WeightsDetail
from edgeinfer.planning.models.spec import ModelSpec

SCALE_BYTES = 4  # one fp32 scale per output channel of a per-channel quantized matrix
HOST_EMBED_BYTES = 2  # the host keeps the embedding table in fp16


@dataclass(frozen=True)
class LayerCounts:
    """Parameters of one decoder layer and of the head, and the output channels of their matrices."""

    layer_params: int
    layer_out_channels: int  # q, k, v, o, gate, up, down rows
    head_params: int  # final norm + lm_head
    head_out_channels: int  # lm_head rows
    embedding_params: int


def pageable(spec: ModelSpec) -> bool:
    """A dense decoder whose layers are all alike (MoE layers differ: not paged by this rule)."""
    return bool(spec.has_kv and not spec.is_moe and spec.layers and spec.hidden and spec.vocab
                and layer_params(spec) is not None)


def layer_params(spec: ModelSpec) -> int | None:
    """Parameters of one layer: what the model's count leaves after embedding, untied lm_head and the
    final norm, shared by the layers (the readers in planning/models count layers × the per-layer formula)."""
    head = 0 if spec.tied_embeddings else spec.lm_head_params
    body = spec.params_total - spec.embedding_params - head - spec.hidden
    if body <= 0 or body % spec.layers:
        return None
    return body // spec.layers


def counts(spec: ModelSpec) -> LayerCounts:
    per = layer_params(spec)
    if per is None:
        raise ValueError(f"{spec.name}: layers are not alike")
    h, nh, kv, hd = spec.hidden, spec.heads, spec.kv_heads, spec.head_dim
    return LayerCounts(layer_params=per, layer_out_channels=nh * hd + 2 * kv * hd + h + 2 * spec.intermediate + h,
                       head_params=spec.hidden + spec.vocab * spec.hidden, head_out_channels=spec.vocab,
                       embedding_params=spec.embedding_params or spec.vocab * spec.hidden)


def weight_bytes(params: int, out_channels: int, scheme: Scheme) -> int:
    """fp16: 2 B a parameter; per-channel int (w8a8): 1 B + one fp32 scale per output channel;
    grouped int: bits per weight with the group scales (quant.py)."""
    if scheme.kind == "int" and not scheme.group_size:
        return params * scheme.weight_bits // 8 + SCALE_BYTES * out_channels
    return math.ceil(params * scheme.bpw / 8)


def layer_groups(layers: int, segments: int) -> list[int]:
    """Layers per segment, numpy.array_split style: the first ``layers mod segments`` get one more."""
    q, r = divmod(layers, segments)
    return [q + 1 if i < r else q for i in range(segments)]


def segment_bytes(spec: ModelSpec, scheme: Scheme, segments: int) -> list[int]:
    c = counts(spec)
    one = weight_bytes(c.layer_params, c.layer_out_channels, scheme)
    out = [n * one for n in layer_groups(spec.layers, segments)]
    out[-1] += weight_bytes(c.head_params, c.head_out_channels, scheme)
    return out


def host_bytes(spec: ModelSpec) -> int:
    return counts(spec).embedding_params * HOST_EMBED_BYTES


def weights(spec: ModelSpec, scheme: Scheme) -> tuple[int, WeightsDetail]:
    """Every segment resident and the host's table: what a runtime whose profile says ``weights_rule:
    decoder_segments`` (rknn) holds for a decoder, paged or not."""
    c = counts(spec)
    head = weight_bytes(c.head_params, c.head_out_channels, scheme)
    body = sum(segment_bytes(spec, scheme, 1)) - head
    host = host_bytes(spec)
    basis = (f"the layer-paged export's count: layers and head at {scheme.name} with their scales, the head held "
             "even when tied, the embedding table fp16 on the host")
    return body + head + host, WeightsDetail(basis, body=body, embedding=host, lm_head=head,
                                             embedding_bits=8 * HOST_EMBED_BYTES)


@lru_cache(maxsize=64)
def _replayed(seg: tuple[int, ...], window: int, prefetch: bool) -> dict:
    """One replay of the schedule per (segments, window, prefetch): resident bytes, paged-in bytes and loads
    all read it, for every window ``plan`` tries when it suggests one (read-only: callers never change it)."""
    return simulate(seg, window, prefetch)


def resident_bytes(seg: Sequence[int], window: int | None, prefetch: bool = False) -> int:
    """Peak bytes of the segments the schedule keeps resident; all of them when W ≥ S."""
    if window is None or window >= len(seg):
        return sum(seg)
    return _replayed(tuple(seg), window, prefetch)["peak_resident_bytes"]


def resident_floor(seg: Sequence[int], window: int) -> int:
    """A floor under :func:`resident_bytes` with or without prefetch, without replaying the schedule: the pinned
    prefix is never evicted, so the largest streamed segment is resident with all of it once the first pass
    reaches it. ``plan`` skips the windows this already rules out."""
    if window >= len(seg):
        return sum(seg)
    pinned = [Schedule(len(seg), window, prefetch, None).pinned for prefetch in (False, True)]
    return min(sum(seg[:k]) + max(seg[k:]) for k in pinned)


def paged_in_bytes(seg: Sequence[int], window: int | None, prefetch: bool = False) -> int:
    """Bytes paged in per token in the steady state: the unpinned segments; nothing when all are resident."""
    if window is None or window >= len(seg):
        return 0
    return _replayed(tuple(seg), window, prefetch)["steady_bytes"]


def paged_in_loads(seg: Sequence[int], window: int | None, prefetch: bool = False) -> int:
    if window is None or window >= len(seg):
        return 0
    return len(_replayed(tuple(seg), window, prefetch)["steady_loads"])


def step_seconds(compute_s: float, page_in_s: float, shared_bus: bool) -> float:
    """max(compute, page-in) when the page-in comes over its own bus (storage, prefetched while the
    previous segment computes); compute + page-in when it is a copy on the DRAM bus compute reads."""
    return compute_s + page_in_s if shared_bus else max(compute_s, page_in_s)


def page_in_seconds(nbytes: int, gbps: float | None, shared_bus: bool) -> float | None:
    """A DRAM-to-DRAM copy reads and writes: twice the bytes on the bus."""
    if not nbytes:
        return 0.0
    if not gbps:
        return None
    return (2 if shared_bus else 1) * nbytes / (gbps * 1e9)
