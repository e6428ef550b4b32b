"""``deploy DECODER --paging W|auto [--segments N]``: which segmented decoder to build (docs/paging.md#decoders).

The backend converts the segments (its decoder convert option ``segments``) and loads them paged (its
load option ``window``); a backend that declares neither cannot page decoders and ``--paging`` is
refused. ``auto`` takes the plan's choice (:func:`edgeinfer.planning.decoder_paging.choose`); when the
plan needs no paging it builds the decoder unpaged and says so — the user asked for what the board
needs, and the board needs nothing paged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.contract.backend import Backend
from edgeinfer.errors import InputError

AUTO = "auto"


@dataclass(frozen=True)
class Paging:
    window: int
    segments: int
    chosen_by: str  # what picked them, said on stderr and kept in the manifest


def parse(value: str | int | None) -> int | str | None:
    """``--paging``'s value: a positive window, ``auto`` or None."""
    if value is None or value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    try:
        w = int(str(value).strip())
    except ValueError:
        w = 0
    if w < 1:
        raise InputError(f"--paging must be a positive window (segments resident) or auto, got {value!r}")
    return w


def choose(paging: int | str | None, segments: int | None, backend: Backend, hf_dir: Path, p: Any,
           own_runtime: str, notes: list[str]) -> Paging | None:
    """The segments and window to build for unpaged plan ``p`` (deploy's), checked against the backend and the
    model; None: build unpaged (no ``--paging``, or ``auto`` on a plan that needs none: said in ``notes``)."""
    from edgeinfer.planning import decoder_paging

    paging = parse(paging)
    if paging is None:
        if segments is not None:
            raise InputError("--segments goes with --paging W|auto (decoder segments resident at once)")
        return None
    b, runtime = p.board, p.runtime
    if not backend.decoders.pages:
        raise InputError(f"--paging: board {b.name}'s backend {backend.name} cannot page decoders (its decoder "
                         "conversion takes no segments option); deploy without --paging", kind="not_supported")
    if runtime != own_runtime:
        raise InputError(f"--paging builds segments for runtime {own_runtime}, which edgeinfer pages; {runtime} "
                         "runs whole models: drop --runtime or --paging")
    layers = p.model.layers
    if segments is not None and (isinstance(segments, bool) or not isinstance(segments, int)
                                 or not 1 <= segments <= layers):
        raise InputError(f"--segments must be 1..{layers} (the layers of {hf_dir.name}), got {segments}")
    if paging == AUTO:
        got = decoder_paging.choose(p, segments)
        if got is None:
            notes.append(f"--paging auto: the plan needs no paging for {hf_dir.name} on {b.name} (the weights fit "
                         "the board and one NPU window, or no window fits): building it unpaged")
            return None
        w, n = got
        return Paging(w, n, f"--paging auto: the plan's largest window that fits ({w} of {n} segments)")
    n = segments or layers
    if paging > n:
        raise InputError(f"--paging {paging}: the window is at most the {n} segments; pass --paging 1..{n}")
    return Paging(paging, n, f"--paging {paging} --segments {n}")


def manifest_section(paging: Paging, plan: Any) -> dict[str, Any]:
    """The manifest's ``decoder.paging``: segments, window, the largest window the board holds per the plan
    (what ``--window`` may ask at load) and the plan's figures for the window built."""
    from edgeinfer.planning.planner import plan as make_plan
    from edgeinfer.run.paged_decoder import figures

    largest = next((w for w in range(paging.segments, 0, -1)
                    if make_plan(plan.model, plan.board, quant=plan.scheme.name, ctx=plan.ctx, runtime=plan.runtime,
                                 paging=w, segments=paging.segments, suggest=False,
                                 prefill_chunk=plan.prefill_chunk).fits), None)
    return {"segments": paging.segments, "window": paging.window, "chosen_by": paging.chosen_by,
            "max_window": largest, "predicted": figures(plan.details.paging)}


def note(paging: Paging, plan: Any) -> str:
    """One line: what is built and what the plan predicts for it."""
    c = plan.details.paging
    speed = f", decode ≈ {c.decode_tokens_per_s:.3g} tok/s predicted" if c.decode_tokens_per_s else ""
    return (f"{paging.chosen_by}: {paging.segments} segments, {paging.window} resident "
            f"({c.npu_resident_bytes / 2**20:.1f} MiB of weights on the NPU){speed}")


def adopt_chunk(plan: Any, options: dict[str, Any], notes: list[str]) -> Any:
    """A paged build without ``--option prefill_chunk``: the plan's larger chunk when it prefills faster (paging
    every segment in once per chunk, :func:`edgeinfer.planning.paging.larger_chunk`), set in ``options``, and
    the plan of that build; else ``plan`` as it is."""
    from edgeinfer.planning.planner import plan as make_plan

    s = plan.suggestions.prefill_chunk if plan.suggestions else None
    if not s:
        return plan
    c = plan.details.paging
    options["prefill_chunk"] = s["prefill_chunk"]
    notes.append(f"prefill chunk {s['prefill_chunk']} (the plan's for a paged decoder): prefill ≈ "
                 f"{s['prefill_tokens_per_s']:.3g} tok/s, {s['speedup']:g}× the {plan.chunk}-token default's; "
                 "--option prefill_chunk=N overrides it")
    return make_plan(plan.model, plan.board, quant=plan.scheme.name, ctx=plan.ctx, runtime=plan.runtime,
                     paging=c.window, segments=c.segments, storage=c.storage, kv_dtype=plan.kv_dtype,
                     prefill_chunk=s["prefill_chunk"])
