"""The named parts of a plan: its memory details (``Plan.details``, ``memory.details`` in ``edgeinfer plan
--json``: how each share of the breakdown was worked out, docs/planner.md), its speed estimates
(``Plan.estimates``), the paging cost model's answer (``details.paging``), its suggestions
(``Plan.suggestions``) and a matrix cell a board refused. schemas/plan.schema.json gives their JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from edgeinfer.planning import prefill

PAGED_RATES = ("decode_tokens_per_s", "prefill_tokens_per_s")  # the estimates paging replaces


def _present(record: Any) -> dict[str, Any]:
    """The fields that apply to this record (None: the formula that made it has no such term)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}


@dataclass
class WeightsDetail:
    """Exact bytes from a model file (``file_bytes``), or parameter counts × bits per weight (``body``...)."""

    basis: str
    file_bytes: int | None = None
    embedding_duplicate: int | None = None  # a runtime that keeps a tied embedding twice
    body: int | None = None
    embedding: int | None = None
    lm_head: int | None = None
    embedding_bits: float | None = None
    total_bytes_unpaged: int | None = None  # with --paging: the breakdown holds the resident weights only
    paged: str | None = None  # with --paging: "W of N segments resident"

    def to_dict(self) -> dict[str, Any]:
        return _present(self)


@dataclass
class ActivationsDetail:
    """The largest single layer's buffers + inputs + logits; only ``basis`` when the architecture is unknown."""

    basis: str
    tokens_per_step: int | None = None
    inputs: int | None = None
    attention: int | None = None
    ffn: int | None = None
    logits: int | None = None
    vision_encoder: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return _present(self)


@dataclass
class KvCacheDetail:
    bytes_per_element: float
    tokens: int
    batch: int
    bytes_per_token: int


@dataclass
class RuntimeDetail:
    overhead_mib: float
    source: str | None
    memory_fraction: float | None  # a runtime that claims this fraction of usable memory up front
    weights_fraction: float | None = None  # a fitted overhead with a share of the weights: value + this × weights
    layers_mib: float | None = None  # what the runtime holds per decoder layer, all layers (layer_overhead_bytes)


@dataclass
class ReservedDetail:
    gib: float
    source: str


@dataclass
class MemoryDetails:
    weights: WeightsDetail
    activations: ActivationsDetail
    kv_cache: KvCacheDetail
    runtime: RuntimeDetail
    reserved: ReservedDetail
    paging: PagingCost | None = None  # with --paging: the paging cost model's answer (docs/paging.md)

    def to_dict(self) -> dict[str, Any]:
        out = {"weights": self.weights.to_dict(), "activations": self.activations.to_dict(),
               "kv_cache": asdict(self.kv_cache), "runtime": asdict(self.runtime), "reserved": asdict(self.reserved)}
        if self.paging is not None:
            out["paging"] = self.paging.to_dict()
        return out


@dataclass(frozen=True)
class PagingCost:
    """The paging cost model's answer (planning.paging: ``plan_paging`` for whole-model segments, the
    decoder rule's ``decoder_paging_cost``); a field is None where that rule or case has no such key."""

    present: tuple[str, ...]  # the keys the cost model gave, in its order (the JSON keeps them as they are)
    window: int | None = None
    segments: int | None = None
    segment_bytes: tuple[int, ...] = ()
    largest_segment_bytes: int | None = None
    resident_weight_bytes: int | None = None
    resident_total_bytes: int | None = None
    streamed_bytes_per_token: int | None = None
    loads_per_token: int | None = None
    prefetch: bool | None = None
    storage: str | None = None  # board, nvme, emmc, sd, dram
    storage_gbps: float | None = None
    storage_source: str | None = None
    fits: bool | None = None
    reasons: tuple[str, ...] = ()
    npu_window_bytes: int | None = None
    npu_window_ok: bool | None = None
    stream_s_per_token: float | None = None
    shared_bus: bool | None = None
    compute_s_per_token: float | None = None
    decode_tokens_per_s: float | None = None
    bound: str | None = None  # compute, storage or "page-in copy"
    load_hidden_fraction: float | None = None
    prefill_passes: int | None = None
    prefill_tokens_per_s: float | None = None
    # whole-model segments (plan_paging): each resident segment's runtime instance and its buffers
    resident_instances: int | None = None
    segment_buffer_bytes: int | None = None
    buffer_bytes: int | None = None
    # the decoder rule (decoder_paging_cost)
    rule: str | None = None
    npu_resident_bytes: int | None = None
    host_weight_bytes: int | None = None
    kv_bytes: int | None = None
    decode_tokens_per_s_unpaged: float | None = None
    paged_cost_tokens_per_s: float | None = None
    paged_cost_pct: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PagingCost:
        seq = {k: tuple(d[k]) for k in ("segment_bytes", "reasons") if k in d}
        return cls(present=tuple(d), **{**d, **seq})

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v := getattr(self, k), tuple) else v for k in self.present}

    def estimate_dict(self) -> dict[str, Any]:
        """What ``estimates.paging`` carries of it."""
        return {k: getattr(self, k) for k in ("window", "segments", "streamed_bytes_per_token", "loads_per_token",
                                              "stream_s_per_token", "decode_tokens_per_s", "prefill_tokens_per_s",
                                              "bound", "load_hidden_fraction", "prefetch", "storage_gbps",
                                              "storage_source")}


@dataclass(frozen=True)
class Estimates:
    """Decode / prefill speed from the bandwidth model (docs/planner.md); with --paging the paged figures,
    the unpaged ones kept in ``*_unpaged`` for each rate the paging cost model gives."""

    runtime: str
    decode_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    bytes_per_token: int
    weight_bytes_per_token: int
    kv_bytes_per_token_at_ctx: int
    bandwidth_gbps: float | None
    roofline_tokens_per_s: float | None
    roofline_fraction: float | None
    t0_ms: float | None
    bw_eff_gbps: float | None
    prefill_fraction_of_peak: float | None
    basis: str
    assumes: str
    decode_error_pct: float | None = None  # the constants' left-out median |error| (widened when extrapolated)
    error_basis: str | None = None  # how decode_error_pct was found ("leave-one-source-out, N rows from S sources")
    bw_fraction: float | None = None  # BW_eff / the board's bandwidth (with speed constants, as bw_eff_gbps)
    paging: PagingCost | None = None
    decode_tokens_per_s_unpaged: float | None = None
    prefill_tokens_per_s_unpaged: float | None = None
    prefill_t0_ms: float | None = None  # TTFT = prefill_t0_ms + prompt / prefill_tokens_per_s (planning.prefill)
    prefill_error_pct: float | None = None
    prefill_error_basis: str | None = None
    ttft_prompts: tuple[int, ...] = ()  # the prompt lengths ``ttft_ms`` is given for

    def error_bar(self) -> str:
        """``±9 % (leave-one-source-out, 41 rows from 4 sources)``, or why there is none."""
        if self.decode_error_pct is None:
            return f"(error unknown: {self.error_basis})" if self.error_basis else ""
        return f"±{self.decode_error_pct:g} % ({self.error_basis})"

    def ttft_ms(self) -> list[dict[str, Any]]:
        """The time to the first token of each of ``ttft_prompts``, at the plan's prefill rate (paged when paged)."""
        if not self.prefill_tokens_per_s:
            return []
        return [{"prompt_tokens": n, "ms": prefill.ttft_ms(self.prefill_t0_ms or 0.0, self.prefill_tokens_per_s, n)}
                for n in self.ttft_prompts]

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)[:16]}  # up to error_basis: always there
        out.update(prefill_t0_ms=self.prefill_t0_ms, prefill_error_pct=self.prefill_error_pct,
                   prefill_error_basis=self.prefill_error_basis, ttft_ms=self.ttft_ms())
        if self.bw_eff_gbps is not None:
            out["bw_fraction"] = self.bw_fraction
        if self.paging is not None:
            out["paging"] = self.paging.estimate_dict()
            out.update({f"{k}_unpaged": getattr(self, f"{k}_unpaged") for k in PAGED_RATES
                        if getattr(self.paging, k) is not None})
        return out


@dataclass
class Suggestions:
    """What would make a plan fit: the largest context, the best scheme, the smallest board of the family; and
    a faster runtime for the plan's scheme where the board has one, the same weights with int8 activations where
    the runtime decodes those faster, a larger prefill chunk for a paged decoder, a smaller KV cache the runtime
    builds."""

    max_ctx: int | None = None
    quant: str | None = None  # the best scheme that fits at the plan's context
    quants_that_fit: list[dict[str, Any]] = field(default_factory=list)  # {quant, runtime, bits_per_weight}
    board: str | None = None
    paging: dict[str, Any] | None = None  # a paging window that fits (planning.paging.suggest_window)
    runtime: dict[str, Any] | None = None  # another runtime that decodes the scheme faster here (runtime_choice)
    prefill_chunk: dict[str, Any] | None = None  # a paged decoder's larger chunk that prefills faster (paging)
    activations: dict[str, Any] | None = None  # the same weights with int8 activations, faster (activation_choice)
    kv_cache: dict[str, Any] | None = None  # a smaller KV cache the runtime builds (kv_choice)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RefusedCell:
    """A matrix cell whose board cannot take the model (``edgeinfer plan ... --board all``)."""

    model: str
    board: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"model": {"name": self.model}, "board": {"name": self.board}, "error": self.error}
