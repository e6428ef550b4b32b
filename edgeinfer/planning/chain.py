"""Several models served together on one board (``edgeinfer plan A B C --board B`` or a chain file), laid out in
processes as ``edgeinfer serve`` lays them out (docs/planner.md#a-chain-of-models-on-one-board):

- serve's HTTP process (and, with an encoder, reranker or classifier, multiprocessing's resource tracker and the
  arrays the HTTP process batches): once (:mod:`.serve_memory`), plus the tokenizer the HTTP process holds for
  each encoder, reranker and classifier;
- one encoder worker per ``--devices`` entry (``workers``), each holding **every** encoder, reranker and
  classifier bundle: their weights, KV and activations add up, and each runtime's fixed overhead counts once
  per worker (its part proportional to the weights, where fitted, stays with each model);
- one process per decoder, holding its whole plan at ``batch`` = serve's ``--slots``;
- the board's OS reserve: once.

A member is built from a plan's JSON form (``Plan.to_dict()``, or the plan ``deploy`` recorded in a bundle's
manifest: :func:`member`), so ``plan`` and ``serve``'s start-up check add the same figures (:func:`layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeinfer.planning.activations import spans_batch
from edgeinfer.planning.boards import GIB, Board
from edgeinfer.planning.planner import runtime_profile
from edgeinfer.planning.serve_memory import (
    in_process_saving_bytes,
    serve_own_bytes,
    serve_processes,
    served_worker_saving_bytes,
)

KIND = "edgeinfer.plan_chain"
MIB = 2**20
SERVE_MAX_BATCH = 32  # serve's --max-batch default: rows an encoder runs at once (an encoder's batch in a chain)
SERVE_SLOTS = 4  # serve's --slots default: sequences a decoder holds KV for (a decoder's batch in a chain)
PARTS = ("weights", "kv_cache", "activations", "runtime")


@dataclass
class Member:
    """One model of the chain: its own memory (the runtime split into the fixed part a process pays once per
    runtime and the part that grows with the weights) and the reasons other than memory it does not fit."""

    name: str
    decoder: bool
    runtime: str
    weights: int
    kv_cache: int
    activations: int
    runtime_fixed: int
    runtime_scaled: int
    options: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    tokenizer: int = 0  # a decoder's tokenizer, held by the HTTP process (serve_memory.tokenizer_bytes)
    # what its served worker holds less than its plan's process (serve_memory.served_worker_saving_bytes)
    worker_saving: int = field(default_factory=served_worker_saving_bytes)


def member(name: str, plan: dict[str, Any], decoder: bool, usable_bytes: int,
           reasons: list[str] | None = None) -> Member:
    """A chain member from a plan's JSON form (``options`` and ``memory.breakdown`` / ``memory.details.runtime``)."""
    bd, rt = plan["memory"]["breakdown"], plan["memory"]["details"]["runtime"]
    fixed = int(rt["overhead_mib"] * MIB)
    if rt.get("memory_fraction"):  # a runtime that takes a share of the board (as planner._memory counts it)
        fixed += int((1 - rt["memory_fraction"]) * usable_bytes)
    fixed = min(fixed, bd["runtime"])
    served = plan["memory"].get("served") or {}
    return Member(name, decoder, plan["options"]["runtime"], bd["weights"], bd["kv_cache"], bd["activations"],
                  fixed, bd["runtime"] - fixed, dict(plan["options"]), list(reasons or []),
                  served.get("tokenizer_bytes", 0), served.get("worker_saving_bytes", served_worker_saving_bytes()))


def rescaled(plan: dict[str, Any], batch: int, ctx: int | None = None) -> dict[str, Any]:
    """A recorded plan at another batch (serve's ``--max-batch`` rows of an encoder, ``--slots`` of a decoder) and
    context: activations and the KV cache grow in proportion to the batch (an encoder's activations exactly:
    every buffer is batch × tokens; where one prefill chunk holds every sequence's tokens, only the logits rows),
    the KV cache in proportion to the context (a sliding-window model's less: this overcounts it)."""
    o, bd = plan["options"], dict(plan["memory"]["breakdown"])
    f = batch / max(1, o.get("batch") or 1)
    act = plan["memory"].get("details", {}).get("activations") or {}
    spans = spans_batch(runtime_profile(o["runtime"]), bool(plan.get("model", {}).get("encoder")))
    if spans and "logits" in act and batch <= (act.get("tokens_per_step") or 0):
        bd["activations"] = int(bd["activations"] + act["logits"] * (f - 1))
    else:
        bd["activations"] = int(bd["activations"] * f)
    bd["kv_cache"] = int(bd["kv_cache"] * f * ((ctx or o["ctx"]) / max(1, o["ctx"])))
    return {**plan, "options": {**o, "batch": batch, "ctx": ctx or o["ctx"]},
            "memory": {**plan["memory"], "breakdown": bd}}


@dataclass
class Process:
    name: str
    parts: dict[str, dict[str, int]]  # model -> its bytes in this process (weights, kv_cache, activations, runtime)
    own_bytes: int = 0  # the process's own memory, no model's (serve's HTTP process)

    @property
    def total_bytes(self) -> int:
        return self.own_bytes + sum(sum(p.values()) for p in self.parts.values())


def _parts(m: Member, fixed: bool) -> dict[str, int]:
    return {"weights": m.weights, "kv_cache": m.kv_cache, "activations": m.activations,
            "runtime": m.runtime_scaled + (m.runtime_fixed if fixed else 0)}


def layout(members: list[Member], workers: int = 1, in_process: bool = False) -> list[Process]:
    """The processes serve starts for ``members`` with ``workers`` encoder workers (``--devices`` entries; 1 when
    none are given). In a worker a runtime's fixed overhead is charged to the first model that uses it.
    A decoder's process is its plan's less what a served worker holds less (:func:`~edgeinfer.planning.serve_memory.
    served_worker_saving_bytes`); ``in_process`` (``serve --in-process``): decoders run in the HTTP process, each
    one interpreter lighter still (:func:`~edgeinfer.planning.serve_memory.in_process_saving_bytes`)."""
    encoders = [m for m in members if not m.decoder]
    name = "serve (HTTP process and resource tracker)" if encoders else "serve (HTTP process)"
    procs = [Process(name, {}, serve_own_bytes(len(encoders)) + sum(m.tokenizer for m in members))]
    for i in range(max(1, workers) if encoders else 0):
        seen: dict[str, int] = {}
        parts = {}
        for m in encoders:
            charged = seen.setdefault(m.runtime, m.runtime_fixed)
            if m.runtime_fixed > charged:  # models of one runtime: the largest fixed overhead, once
                seen[m.runtime] = m.runtime_fixed
            parts[m.name] = _parts(m, fixed=False)
        for rt, fixed in seen.items():
            first = next(m.name for m in encoders if m.runtime == rt)
            parts[first]["runtime"] += fixed
        procs.append(Process(f"encoder worker {i + 1}" if workers > 1 else "encoder worker", parts))
    decoders = {m.name: _parts(m, fixed=True) for m in members if m.decoder}
    for m in members:
        if m.decoder:
            decoders[m.name]["runtime"] = max(0, decoders[m.name]["runtime"] - m.worker_saving
                                              - (in_process_saving_bytes() if in_process else 0))
    if in_process:
        procs[0].parts.update(decoders)
        procs[0].name += ", decoders on its threads"
        return procs
    return procs + [Process(f"decoder worker {name}", {name: parts}) for name, parts in decoders.items()]


@dataclass
class ChainPlan:
    board: Board
    members: list[Member]
    processes: list[Process]
    suggestions: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def reserved_bytes(self) -> int:
        return self.board.reserve_bytes

    @property
    def total_bytes(self) -> int:
        return sum(p.total_bytes for p in self.processes) + self.reserved_bytes

    @property
    def capacity_bytes(self) -> int:
        return self.board.total_bytes

    def model_bytes(self, name: str) -> dict[str, int]:
        """``name``'s bytes over every process holding it (each encoder worker holds its own copy)."""
        out = dict.fromkeys(PARTS, 0)
        for p in self.processes:
            for k, v in p.parts.get(name, {}).items():
                out[k] += v
        return out

    @property
    def largest(self) -> str:
        return max(self.members, key=lambda m: sum(self.model_bytes(m.name).values())).name

    @property
    def reasons(self) -> list[str]:
        out = []
        if self.total_bytes > self.capacity_bytes:
            out.append(f"together they need {self.total_bytes / GIB:.2f} GiB, {self.board.name} has "
                       f"{self.capacity_bytes / GIB:.2f} GiB ({self.board.usable_bytes / GIB:.2f} GiB usable after "
                       f"the OS/driver reserve); the largest is {self.largest} "
                       f"({sum(self.model_bytes(self.largest).values()) / GIB:.2f} GiB)")
        return out + [f"{m.name}: {r}" for m in self.members for r in m.reasons]

    @property
    def fits(self) -> bool:
        return not self.reasons

    def in_process_saving(self, workers: int = 1) -> int | None:
        """When this chain (each decoder in a worker process) does not fit and the same models laid out as ``serve
        --in-process`` starts them do: the bytes that layout needs less; else None."""
        if self.fits or not any(m.decoder for m in self.members):
            return None
        lean = ChainPlan(self.board, self.members, layout(self.members, workers, in_process=True))
        return self.total_bytes - lean.total_bytes if lean.fits else None

    def refusal(self) -> str:
        """One line: the total, the board's budget and the largest contributor."""
        n = len(self.members)
        who = f"these {n} models need" if n > 1 else "this model needs"
        return (f"{who} {self.total_bytes / GIB:.2f} GiB{' together' if n > 1 else ''} on {self.board.name}, "
                f"which has {self.capacity_bytes / GIB:.2f} GiB; the largest is {self.largest} "
                f"({sum(self.model_bytes(self.largest).values()) / GIB:.2f} GiB)")

    def to_dict(self) -> dict[str, Any]:
        from edgeinfer.planning.planner import SCHEMA_VERSION

        b = self.board
        where = {m.name: [p.name for p in self.processes if m.name in p.parts] for m in self.members}
        return {
            "schema_version": SCHEMA_VERSION, "kind": KIND, "fits": self.fits,
            "verdict": "fits" if self.fits else "does not fit", "reasons": self.reasons,
            "board": {"name": b.name, "title": b.title, "family": b.family, "backend": b.backend,
                      "memory_kind": b.memory_kind, "origin": b.origin},
            "memory": {"total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes,
                       "usable_bytes": b.usable_bytes, "headroom_bytes": self.capacity_bytes - self.total_bytes,
                       "reserved_bytes": self.reserved_bytes, "largest": self.largest,
                       "serve_processes_source": serve_processes()["source"]},
            "models": [{"name": m.name, "kind": "decoder" if m.decoder else "encoder", "options": m.options,
                        "processes": where[m.name], "reasons": m.reasons,
                        "memory": {**self.model_bytes(m.name), "total_bytes": sum(self.model_bytes(m.name).values())}}
                       for m in self.members],
            "processes": [{"name": p.name, "models": list(p.parts), "own_bytes": p.own_bytes,
                           "total_bytes": p.total_bytes} for p in self.processes],
            "suggestions": self.suggestions, "warnings": self.warnings,
        }
