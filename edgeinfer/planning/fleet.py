"""Which model fits which node type of a fleet, and how many replicas one node holds (``plan --fleet``).

Each model × board pair is planned by :func:`edgeinfer.planning.planner.plan` with ``batch = slots``.
A replica holds its own weights, KV cache (ctx × slots), activations and runtime overhead; the board
holds the OS/driver reserve once. On a board with dedicated memory on several chips (an Atlas 300I Duo)
a replica runs on one chip and sees that chip's share of the memory, so::

    units              = chips (dedicated memory) or 1 (shared memory)
    replicas per unit  = floor(((total − reserve) / units) / (weights + kv_cache + activations + runtime))
    replicas per node  = replicas per unit × units

A model split across chips (tensor parallel) is not planned here. Each placement counts a node as its
own: models placed on the same node type share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgeinfer.errors import InputError

if TYPE_CHECKING:
    from edgeinfer.planning.boards import Board
    from edgeinfer.planning.models.spec import ModelSpec

PER_REPLICA = ("weights", "kv_cache", "activations", "runtime")


class FleetNode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    board: str = Field(min_length=1)  # a board profile name, or a YAML path (relative to the fleet file)
    count: int = Field(default=1, ge=1)


class FleetModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)  # catalog name, HF id or directory, config.json, .gguf ...
    name: str | None = None
    quant: str | None = None
    ctx: int | None = Field(default=None, ge=1)  # default: what `plan` and `deploy` take (planning.decision)
    slots: int = Field(default=1, ge=1)


class FleetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[FleetNode] = Field(min_length=1)
    models: list[FleetModel] = Field(min_length=1)


@dataclass
class Placement:
    model: str
    board: str
    nodes: int
    fits: bool
    replicas_per_node: int
    replicas_total: int
    units: int
    per_replica_bytes: int
    pool_bytes: int  # memory replicas share on one node: total − reserve
    quant: str
    runtime: str
    reasons: list[str] = field(default_factory=list)


@dataclass
class FleetPlan:
    placements: list[Placement]
    unplaced: list[str]  # models that fit no node type

    @property
    def fits(self) -> bool:
        return not self.unplaced

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "edgeinfer.fleet_plan", "fits": self.fits, "unplaced": self.unplaced,
                "placements": [asdict(p) for p in self.placements]}


def load_fleet(path: Path) -> FleetSpec:
    """The fleet file, or an InputError naming the file and the first problems."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"{path}: cannot read the fleet file ({e.strerror})") from None
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise InputError(f"{path}: not a valid YAML file ({first})", "see docs/fleet.md for the format") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a fleet file is a mapping with 'nodes' and 'models'", "see docs/fleet.md")
    try:
        spec = FleetSpec.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in e.errors()[:3])
        raise InputError(f"{path}: invalid fleet file: {errs}", "see docs/fleet.md for the format") from None
    for node in spec.nodes:
        local = Path(path).parent / node.board
        if node.board.endswith((".yaml", ".yml")) and local.is_file():
            node.board = str(local)
    return spec


def place(model: FleetModel, spec: ModelSpec, node: FleetNode, board: Board) -> Placement:
    """One model on one node type: the planner's verdict and figures, then the replica count."""
    from edgeinfer.planning.planner import plan

    try:
        p = plan(spec, board, quant=model.quant, ctx=model.ctx, batch=model.slots, suggest=False)
    except InputError as e:  # e.g. a quant this board's runtimes lack: this pair does not fit, others may
        return Placement(model=model.name or spec.name, board=board.name, nodes=node.count, fits=False,
                         replicas_per_node=0, replicas_total=0, units=0, per_replica_bytes=0,
                         pool_bytes=board.usable_bytes, quant=model.quant or "", runtime="", reasons=[e.one_line()])
    per_replica = sum(p.breakdown[k] for k in PER_REPLICA)
    pool = board.total_bytes - p.breakdown["reserved"]
    units = board.chips if board.memory_kind == "dedicated" else 1
    per_unit = max(0, pool) // units
    replicas = per_unit // per_replica * units if per_replica else 0
    reasons = [r for r in p.reasons if not r.startswith("needs ")]  # the planner's memory reason: ours below
    if replicas == 0:
        where = f"one of {units} chips" if units > 1 else "the board"
        reasons.insert(0, f"one replica needs {per_replica / 2**30:.2f} GiB, {where} has {per_unit / 2**30:.2f} GiB "
                          "usable")
    fits = replicas > 0 and not reasons
    per_node = replicas if fits else 0
    return Placement(model=model.name or spec.name, board=board.name, nodes=node.count, fits=fits,
                     replicas_per_node=per_node, replicas_total=per_node * node.count, units=units,
                     per_replica_bytes=per_replica, pool_bytes=pool, quant=p.scheme.name, runtime=p.runtime,
                     reasons=reasons)


def plan_fleet(fleet: FleetSpec) -> FleetPlan:
    """Every model on every node type; a model or board that cannot be read is an InputError (exit 2)."""
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.models import resolve

    boards = [get_board(n.board) for n in fleet.nodes]
    placements, unplaced = [], []
    for model in fleet.models:
        spec = resolve(model.model)
        mine = [place(model, spec, node, board) for node, board in zip(fleet.nodes, boards)]
        placements += mine
        if not any(p.fits for p in mine):
            unplaced.append(mine[0].model)
    return FleetPlan(placements, unplaced)
