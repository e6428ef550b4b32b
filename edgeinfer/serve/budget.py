"""``edgeinfer serve``'s start-up check: the bundles it was given, laid out in processes as serve runs them, must fit
their board together (:mod:`edgeinfer.planning.chain`, the sum ``edgeinfer plan A B C --board B`` answers).

serve has no memory budget of its own: the budget is the board the bundles were deployed for (their manifests'
``board``; ``host``: this machine's memory available now). Each bundle counts with the plan ``deploy`` recorded in
its manifest, at serve's ``--max-batch`` (encoders) or ``--slots`` and context (decoders). Not counted, and said in
the log at debug level (a start-up that fails later stays one line): a Hugging Face decoder directory or decoder
file (no recorded plan), a bundle without a recorded plan, and every bundle when they name different boards or a
board this installation does not know."""

from __future__ import annotations

import logging
from typing import Any

from edgeinfer.errors import CheckFailed, EdgeInferError
from edgeinfer.model.bundle import read_manifest
from edgeinfer.model.kind import Kind, kind
from edgeinfer.planning.chain import ChainPlan, layout, member, rescaled
from edgeinfer.serve.config import ServeConfig

log = logging.getLogger("edgeinfer.serve")


def check_budget(models: dict[str, Any], decoders: dict[str, Any], config: ServeConfig) -> ChainPlan | None:
    """The ChainPlan of what ``config`` serves; raise CheckFailed (one line: the total, the board's budget, the
    largest model) when it does not fit; None when nothing could be counted (see the module's doc)."""
    recorded: list[tuple[str, dict[str, Any], bool, int, int | None]] = []
    skipped: list[str] = []
    boards: set[str] = set()
    for name, m in models.items():
        _add(recorded, skipped, boards, name, m.bundle.manifest, False, config.max_batch, None)
    for name, d in decoders.items():
        man = read_manifest(d.path) if kind(d.path, "bundle") is Kind.DECODER_BUNDLE else None
        _add(recorded, skipped, boards, name, man, True, config.slots, d.context)
    if skipped:
        log.debug("memory check: %s not counted (no plan recorded by edgeinfer deploy)", ", ".join(skipped))
    if not recorded:
        return None
    if len(boards) > 1:
        log.debug("memory check skipped: the bundles were deployed for different boards (%s)",
                    ", ".join(sorted(boards)))
        return None
    board = _board(boards.pop())
    if board is None:
        return None
    members = [member(n, rescaled(plan, batch, ctx), dec, board.usable_bytes)
               for n, plan, dec, batch, ctx in recorded]
    chain = ChainPlan(board, members, layout(members, len(config.devices) or 1, config.in_process))
    if not chain.fits:
        hint = ("serve fewer bundles, or deploy smaller ones (plan them together with `edgeinfer plan A B C --board "
                "B`)")
        saving = None if config.in_process or config.devices else chain.in_process_saving()
        if saving is not None:
            hint = (f"add --in-process, which runs each decoder on a thread of the HTTP process and needs "
                    f"{saving / 2**20:.0f} MiB less: then it fits; or " + hint)
        raise CheckFailed(chain.refusal(), hint)
    log.debug("memory check: %d bundles need %.2f GiB together on %s, which has %.2f GiB", len(members),
             chain.total_bytes / 2**30, board.name, chain.capacity_bytes / 2**30)
    return chain


def _add(recorded: list, skipped: list[str], boards: set[str], name: str, manifest: Any, decoder: bool, batch: int,
         ctx: int | None) -> None:
    plan = manifest.plan if manifest is not None else None
    if not plan or "memory" not in plan or "options" not in plan:
        skipped.append(name)
        return
    boards.add(manifest.board)
    recorded.append((name, plan, decoder, batch, ctx))


def _board(name: str) -> Any:
    from edgeinfer.planning.boards import get_board, host_board
    from edgeinfer.planning.host_bandwidth import HostBandwidth

    try:  # the host's bandwidth is not needed for memory: no copy benchmark at start-up
        return host_board(HostBandwidth(0.0, "not measured: memory only")) if name == "host" else get_board(name)
    except EdgeInferError as e:
        log.debug("memory check skipped: %s", e.one_line())
        return None
