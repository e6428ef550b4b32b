"""The named parts of a plan: its memory details (``Plan.details``, ``memory.details`` in ``edgeinfer plan
--json``: how each share of the breakdown was worked out, docs/planner.md) and its suggestions
(``Plan.suggestions``). schemas/plan.schema.json gives their JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


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
    paging: dict[str, Any] | None = None  # with --paging: the paging cost model's answer (docs/paging.md)

    def to_dict(self) -> dict[str, Any]:
        out = {"weights": self.weights.to_dict(), "activations": self.activations.to_dict(),
               "kv_cache": asdict(self.kv_cache), "runtime": asdict(self.runtime), "reserved": asdict(self.reserved)}
        if self.paging is not None:
            out["paging"] = self.paging
        return out


@dataclass
class Suggestions:
    """What would make a plan fit: the largest context, the best scheme, the smallest board of the family."""

    max_ctx: int | None = None
    quant: str | None = None  # the best scheme that fits at the plan's context
    quants_that_fit: list[dict[str, Any]] = field(default_factory=list)  # {quant, runtime, bits_per_weight}
    board: str | None = None
    paging: dict[str, Any] | None = None  # a paging window that fits (planning.paging.suggest_window)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
