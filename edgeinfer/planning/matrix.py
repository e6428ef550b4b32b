"""What ``edgeinfer plan`` answers: one :class:`~edgeinfer.planning.planner.Plan`; several models (or a chain
file) on one named board: the :class:`~edgeinfer.planning.chain.ChainPlan` of serving them together; a
model × board matrix when the board is ``all``.

In a matrix over ``--board all`` a board that cannot take the model (no runtime for the scheme, a
board-specific refusal) is a :class:`~edgeinfer.planning.details.RefusedCell` (JSON: a cell with an
``error``), not a failure of the whole matrix; with a named board the error is raised. The matrix fits
when every planned cell fits (docs/planner.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.planning import planner
from edgeinfer.planning.boards import board_names
from edgeinfer.planning.chain import ChainPlan
from edgeinfer.planning.chain_plan import Entry, is_chain_file, plan_chain, read_chain_file
from edgeinfer.planning.details import RefusedCell
from edgeinfer.planning.models import resolve, vision

KIND = "edgeinfer.plan_matrix"


@dataclass
class PlanMatrix:
    models: list[str]  # as the user named them (the matrix's columns)
    boards: list[str]
    plans: list[planner.Plan | RefusedCell]  # model-major: one per (model, board)

    def cell(self, model: int, board: int) -> planner.Plan | RefusedCell:
        return self.plans[model * len(self.boards) + board]

    @property
    def fits(self) -> bool:
        planned = [c for c in self.plans if isinstance(c, planner.Plan)]
        return bool(planned) and all(c.fits for c in planned)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": planner.SCHEMA_VERSION, "kind": KIND, "fits": self.fits,
                "plans": [c.to_dict() for c in self.plans]}


def plan_models(models: Sequence[str], board: str, ctx: int | None = None, batch: int | None = None,
                image: str | None = None, in_process: bool = False,
                **options: Any) -> planner.Plan | PlanMatrix | ChainPlan:
    """One model on one named board → its Plan (with suggestions); several models (or a chain file) on one
    named board → the ChainPlan of serving them together; ``--board all`` → the matrix (no suggestions).

    ``options`` are :func:`edgeinfer.planning.planner.plan`'s (quant, kv_dtype, runtime, paging, ...);
    ``image`` ("WxH") sizes the vision encoder's activations of vision-language models; ``batch`` None: 1, in a
    chain serve's (chain_plan.plan_chain); ``in_process``: a chain's decoders served ``--in-process``."""
    ctx = None if ctx is None else planner.check_int("ctx", ctx)  # None: each model's limit, capped
    batch = None if batch is None else planner.check_int("batch", batch)
    if board != "all" and (len(models) > 1 or (models and is_chain_file(models[0]))):
        if options.get("prompt") is not None:
            raise InputError("--prompt goes with one decoder's plan: a chain's plan is its memory",
                             "plan the decoder alone with --prompt")
        return (_chain(models, board, in_process, ctx=ctx, batch=batch, **options) if image is None
                else _no_image())
    if in_process:
        raise InputError("--in-process plans a chain (several MODELs on one named board); one model's plan "
                         "already gives its total served --in-process", "drop --in-process")
    if any(is_chain_file(m) for m in models):
        raise InputError("a chain file is planned on one named board, not --board all", "pass --board NAME")
    batch = batch or 1
    specs = [resolve(m) for m in models]
    if image is not None:
        specs = [vision.set_image(s, *vision.parse_image(image)) for s in specs]
    if board != "all" and len(models) == 1:
        return planner.plan(specs[0], board, ctx=ctx, batch=batch, **options)
    boards = board_names() if board == "all" else [board]
    plans = []
    for spec in specs:
        for b in boards:
            try:
                plans.append(planner.plan(spec, b, ctx=ctx, batch=batch, suggest=False, **options))
            except EdgeInferError as e:
                if board != "all":
                    raise
                plans.append(RefusedCell(spec.name, b, e.one_line()))
    return PlanMatrix(list(models), boards, plans)


def _chain(models: Sequence[str], board: str, in_process: bool, **given: Any) -> ChainPlan:
    files = [m for m in models if is_chain_file(m)]
    if files and len(models) > 1:
        raise InputError(f"give a chain file ({files[0]}) alone, or model references without one")
    entries, workers = read_chain_file(files[0]) if files else ([Entry(m) for m in models], 1)
    return plan_chain(entries, board, workers, in_process=in_process, **given)


def _no_image() -> Any:
    raise InputError("--image goes with one vision-language model; plan it alone")
