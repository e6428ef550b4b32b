"""Planner-checked placement for ``serve --ray``: ``plan --fleet``'s arithmetic (edgeinfer/planning/fleet.py)
applied to a decoder bundle on its own board profile, and the replicas the cluster's nodes can hold.

One replica of a decoder bundle holds its weights, the KV cache of ``--slots`` × ``--ctx`` positions,
activations and runtime overhead; a node of the bundle's board holds ``replicas_per_node`` of them
(:func:`edgeinfer.planning.fleet.place`). A replica asks Ray for the share of one unit of the board's resource
that the plan gives it (:func:`share`: 1 / the replicas one unit's memory holds), so a node holds
``min(its units of the resource / share, replicas_per_node)`` replicas of the bundle.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from edgeinfer.errors import CheckFailed

if TYPE_CHECKING:
    from edgeinfer.planning.fleet import Placement


def replica_plan(bundle: Any, resource: str | None, slots: int, ctx: int | None) -> Placement | None:
    """The planner's verdict for ``bundle`` on the node type of its board; None where the planner has nothing
    to say: an embedding / tensor bundle (no model spec) or a CPU bundle (no board, placed anywhere)."""
    from edgeinfer.contract import seal
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.fleet import FleetModel, FleetNode, place
    from edgeinfer.planning.models.hf import spec_from_config

    m = bundle.manifest
    if m.decoder is None or resource is None:
        return None
    name = bundle.path.resolve().name
    config = seal.contained(bundle.path, m.decoder.get("tokenizer", "tokenizer"), "decoder.tokenizer") / "config.json"
    spec = spec_from_config(json.loads(config.read_text(encoding="utf-8")), name, str(config))
    board = get_board(m.board)
    model = FleetModel(model=str(config), name=name, quant=m.scheme, ctx=ctx or int(m.decoder["context"]),
                       slots=slots)
    return place(model, spec, FleetNode(board=board.name), board)


def check_fits(name: str, plan: Placement | None) -> None:
    """Refuse (exit 1) a bundle of which not one replica fits a node of its board."""
    if plan is not None and not plan.fits:
        raise CheckFailed(f"{name} does not fit its board {plan.board}: {'; '.join(plan.reasons)}",
                          "check with `edgeinfer plan --fleet`; lower --slots / --ctx or deploy a smaller scheme")


# Ray keeps fractional resource amounts to 4 decimal places
# (https://docs.ray.io/en/latest/ray-core/scheduling/resources.html#fractional-resource-requirements)
RAY_PRECISION = 10_000


def share(plan: Placement | None) -> float:
    """The part of one unit of its accelerator a replica asks for: 1 / the replicas one unit's memory holds by
    the plan, rounded down to Ray's precision (so that many fit, up to 10 000 per unit); a whole unit where
    nothing is planned."""
    if plan is None or not plan.fits:
        return 1.0
    per_unit = plan.replicas_per_node // plan.units
    return max(1, math.floor(RAY_PRECISION / per_unit)) / RAY_PRECISION if per_unit > 1 else 1.0


def per_node(resource_units: float, plan: Placement | None) -> int:
    """Replicas of a bundle one node with ``resource_units`` of its resource holds: the units over each replica's
    share, at most the plan's replicas per node (the board's memory)."""
    held = math.floor(resource_units / share(plan) + 1e-9)
    return min(held, plan.replicas_per_node) if plan is not None else held


def capacity(resource: str | None, plan: Placement | None, nodes: list[dict[str, Any]], replica_cpus: float) -> int:
    """Replicas of one bundle the alive ``nodes`` (``ray.nodes()``) can hold: per node :func:`per_node`, at most
    the node's CPUs over what one replica asks for (a CPU bundle: the CPUs alone)."""
    held = 0
    for r in (n.get("Resources", {}) for n in nodes if n.get("Alive")):
        counts = [int(r.get("CPU", 0) / replica_cpus)]
        if resource is not None:
            counts.append(per_node(r.get(resource, 0), plan))
        held += min(counts)
    return held


def check_capacity(name: str, plan: Placement | None, wanted: int, held: int, resource: str) -> None:
    """Refuse (exit 1) more replicas than the nodes hold when the plan is what limits them."""
    if plan is None or wanted <= held:
        return
    raise CheckFailed(
        f"{name}: {wanted} replica(s) asked, the cluster's nodes with {resource!r} hold {held}: the plan fits "
        f"{plan.replicas_per_node} replica(s) per {plan.board} node ({plan.per_replica_bytes / 2**30:.2f} GiB each, "
        f"{plan.pool_bytes / 2**30:.2f} GiB usable)",
        "lower --replicas / --max-replicas or --slots / --ctx, or add nodes (`edgeinfer plan --fleet` shows the "
        "arithmetic)")
