"""``edgeinfer plan A B C --board B`` and ``edgeinfer plan chain.yaml --board B``: each model planned as the single
planner plans it, then added up as serve lays them out (:mod:`.chain`), with what to change when the sum does
not fit (docs/planner.md#a-chain-of-models-on-one-board)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.errors import EdgeInferError, InputError
from edgeinfer.planning import planner
from edgeinfer.planning.boards import Board, get_board, load_boards, safe_loader
from edgeinfer.planning.chain import SERVE_MAX_BATCH, SERVE_SLOTS, ChainPlan, Member, layout, member
from edgeinfer.planning.models import resolve

OPTIONS = ("quant", "ctx", "batch", "kv_dtype", "runtime")
FILE_KEYS = ("models", "workers")
DECODER_ONLY = ("ctx", "batch", "kv_dtype")  # command-line options a chain gives its decoders only


@dataclass
class Entry:
    """One model of a chain and its own options (None: the command line's, else the default)."""

    model: str
    options: dict[str, Any] = field(default_factory=dict)


def is_chain_file(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) and Path(ref).expanduser().is_file()


def read_chain_file(path: str | Path) -> tuple[list[Entry], int]:
    """A chain file's models and encoder workers; every mistake is one InputError line naming the file."""
    import yaml

    p = Path(path).expanduser()
    hint = "see docs/planner.md#a-chain-of-models-on-one-board"
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=safe_loader())  # noqa: S506 - a safe loader
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read it ({getattr(e, 'strerror', None) or e})", hint) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "unreadable"
        raise InputError(f"{p}: not valid YAML{where} ({problem})", hint) from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) or not data["models"]:
        raise InputError(f"{p}: needs a 'models' list (each item a model reference or a mapping with 'model')", hint)
    unknown = sorted(set(data) - set(FILE_KEYS), key=str)
    if unknown:
        raise InputError(f"{p}: unknown key {unknown[0]!r} (keys: {', '.join(FILE_KEYS)})", hint)
    workers = data.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InputError(f"{p}: workers must be a positive integer (serve's --devices entries), got {workers!r}",
                         hint)
    return [_entry(p, i, item, hint) for i, item in enumerate(data["models"])], workers


def _entry(p: Path, i: int, item: Any, hint: str) -> Entry:
    where = f"{p}: models[{i}]"
    if isinstance(item, str) and item.strip():
        return Entry(item.strip())
    if not isinstance(item, dict) or not isinstance(item.get("model"), str) or not item["model"].strip():
        raise InputError(f"{where}: give a model reference, or a mapping with 'model' and any of "
                         f"{', '.join(OPTIONS)}", hint)
    unknown = sorted(set(item) - {"model", *OPTIONS}, key=str)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (keys: model, {', '.join(OPTIONS)})", hint)
    for k in ("ctx", "batch"):
        v = item.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InputError(f"{where}: {k} must be a positive integer, got {v!r}", hint)
    for k in ("quant", "kv_dtype", "runtime"):
        if item.get(k) is not None and not isinstance(item[k], str):
            raise InputError(f"{where}: {k} must be a string, got {item[k]!r}", hint)
    return Entry(item["model"].strip(), {k: item[k] for k in OPTIONS if item.get(k) is not None})


def plan_chain(entries: Sequence[Entry], board: str | Board, workers: int = 1, suggest: bool = True,
               in_process: bool = False, **given: Any) -> ChainPlan:
    """Plan every entry on ``board`` (each entry's options over ``given``, the command line's, whose ctx, batch
    and kv_dtype go to the decoders only; a batch defaults to serve's: ``--max-batch`` rows for an encoder,
    ``--slots`` sequences for a decoder) and add them up, laid out as serve starts them (``in_process``: with
    ``--in-process``)."""
    names = [e.model for e in entries]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise InputError(f"model {twice!r} is listed twice; serve holds each model once")
    b = get_board(board)
    planned = [_plan_one(e, b, given) for e in entries]
    chain = ChainPlan(b, [m for m, _, _ in planned], layout([m for m, _, _ in planned], workers, in_process))
    chain.warnings = list(dict.fromkeys(w for m, p, _ in planned for w in p.warnings))
    if suggest and not chain.fits:
        chain.suggestions = _suggestions(chain, planned, workers, given, in_process)
    return chain


def _plan_one(e: Entry, b: Board, given: dict[str, Any]) -> tuple[Member, planner.Plan, dict[str, Any]]:
    spec = resolve(e.model)
    mine = {k: v for k, v in given.items() if v is not None and not (spec.encoder and k in DECODER_ONLY)}
    opts = {**mine, **e.options}
    opts.setdefault("batch", SERVE_MAX_BATCH if spec.encoder else SERVE_SLOTS)
    p = planner.plan(spec, b, suggest=False, **opts)
    own = planner.memory_reason(p.total_bytes, p.board)
    m = member(e.model, p.to_dict(), not spec.encoder, b.usable_bytes, [r for r in p.reasons if r != own])
    return m, p, opts


def _suggestions(chain: ChainPlan, planned: list, workers: int, given: dict[str, Any],
                 in_process: bool) -> dict[str, Any]:
    """Per model, largest first: the best scheme (and for a decoder the longest context) that would fit in
    the room the others leave; and the smallest board of the family that takes the whole chain."""
    models = []
    for m, p, opts in sorted(planned, key=lambda t: -sum(chain.model_bytes(t[0].name).values())):
        others = chain.total_bytes - sum(chain.model_bytes(m.name).values())
        room = chain.capacity_bytes - others + chain.reserved_bytes  # this model's plan counts the reserve too
        fact = chain.board.memory_total_gib.model_copy(update={"value": max(room, 0) / 2**30})
        alone = chain.board.model_copy(update={"memory_total_gib": fact})
        try:
            s = planner.suggestions(planner.plan(p.model, alone, suggest=False, **opts))
        except EdgeInferError:
            s = None
        quant = s.quant if s and s.quant != p.scheme.name else None
        max_ctx = s.max_ctx if s and m.decoder and s.max_ctx and s.max_ctx < p.ctx else None
        models.append({"model": m.name, "quant": quant, "max_ctx": max_ctx})
    saving = None if in_process else chain.in_process_saving(workers)
    return {"models": models, "board": _bigger_board(chain, [e for _, _, e in planned], workers, in_process),
            "in_process": {"saving_bytes": saving} if saving is not None else None}


def _bigger_board(chain: ChainPlan, options: list[dict[str, Any]], workers: int, in_process: bool) -> str | None:
    b = chain.board
    if b.family == "host":
        return None
    for x in sorted(load_boards(family=b.family).values(), key=lambda x: (x.total_bytes, x.name)):
        if x.total_bytes <= b.total_bytes:
            continue
        try:
            entries = [Entry(m.name, o) for m, o in zip(chain.members, options)]
            if plan_chain(entries, x, workers, suggest=False, in_process=in_process).fits:
                return x.name
        except EdgeInferError:
            continue
    return None
