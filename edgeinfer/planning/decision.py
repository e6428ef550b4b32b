"""What gets built for a model on a board: runtime, scheme and context, decided once for ``plan`` and
``deploy`` (docs/planner.md#what-plan-and-deploy-build).

The runtime is the first of the board's runtimes (``default_runtime`` first, then the profile's order) that
takes the model's kind and that this installation can build (``Backend.cannot_build``: the board's backend
installed, capable, and what the runtime needs besides it importable); the scheme is the building backend's
preference among those the board lists for that runtime (decoders: ``Backend.decoders.schemes`` order;
encoders: fp16 where the backend converts it, since the int8 schemes need calibration data, else the backend's
``tensors.default_scheme``: :func:`encoder_schemes`); a file whose format fixes its scheme (.gguf)
keeps it on a runtime that runs such files, and is otherwise refused unless ``--quant`` asks for the model
converted (planned with a note saying so; deploy does not convert such files).
When nothing installed builds any runtime, the board's preferred one is still planned, with what
to install or which ``--runtime`` to pass. The context is the model's own limit, at most
:data:`DECODER_CONTEXT` tokens for decoders and :data:`ENCODER_SEQUENCE` for encoders; a larger one is
refused. Paging (window, segments) is carried as asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.contract.schemes import Scheme, normalize_scheme
from edgeinfer.errors import BackendUnavailableError, InputError
from edgeinfer.planning.boards import Board
from edgeinfer.planning.exportable import unexportable

DECODER_CONTEXT = 2048  # a decoder's default context: its own limit, at most this
ENCODER_SEQUENCE = 128  # an encoder's default sequence length (the deployed static shape): its limit, at most this
FIXED_SCHEME_FORMATS = ("gguf",)  # files whose weights are already in their scheme: deploy does not convert them


@dataclass(frozen=True)
class Option:
    """One board runtime for the model: the scheme it would have, and who builds it here (or why nobody)."""

    runtime: str
    scheme: Scheme
    backend: str | None  # the backend that builds it here
    cannot_build: str | None  # why this installation cannot build it, and what to do; None: it can
    asked: bool = False  # cannot_build is about what the user asked (--quant): an input error, not an install

    def to_dict(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "scheme": self.scheme.name, "backend": self.backend,
                "buildable": self.cannot_build is None, "cannot_build": self.cannot_build}


@dataclass(frozen=True)
class Decision:
    """What ``plan`` plans and ``deploy`` builds for a model on a board."""

    kind: str  # "decoder" | "encoder"
    chosen: Option
    ctx: int
    ctx_default: bool  # the context was not asked for: the model's limit, capped
    best: Option | None = None  # the board's preferred runtime, when it is not the chosen one
    paging: int | None = None  # segments resident at once, as asked (--paging W)
    segments: int | None = None  # as asked (--segments N)
    note: str | None = None  # why the scheme is not the one the model's file is stored in

    @property
    def runtime(self) -> str:
        return self.chosen.runtime

    @property
    def scheme(self) -> Scheme:
        return self.chosen.scheme

    @property
    def buildable(self) -> bool:
        return self.chosen.cannot_build is None

    def refuse_unbuildable(self, board: Board) -> None:
        """Raise what ``deploy`` says when this installation cannot build the chosen runtime."""
        why = self.chosen.cannot_build
        if why is None:
            return
        msg = f"board {board.name}: cannot build {self.kind} models for runtime {self.runtime} here: {why}"
        raise InputError(msg, kind="not_supported") if self.chosen.asked else BackendUnavailableError(msg)

    def lines(self) -> list[str]:
        """What is built, and whether here; the board's preferred runtime when it is not that one."""
        c, b = self.chosen, self.best
        here = f"built here by backend {c.backend}" if c.backend else f"cannot be built here: {c.cannot_build}"
        out = [f"build: {c.runtime} {c.scheme.name}, ctx {self.ctx} ({here})"]
        if b is not None:
            out.append(f"the board's preferred runtime is {b.runtime} ({b.scheme.name}), not built here: "
                       f"{b.cannot_build}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.chosen.to_dict(), "ctx": self.ctx,
                "ctx_chosen_by": "the model's limit, capped" if self.ctx_default else "--ctx",
                "board_best": self.best.to_dict() if self.best else None,
                "paging": self.paging, "segments": self.segments, "scheme_note": self.note}


def default_context(limit: int | None, encoder: bool = False) -> int:
    """The context (encoders: sequence length) used when none is asked for: the model's limit, capped."""
    cap = ENCODER_SEQUENCE if encoder else DECODER_CONTEXT
    return min(limit or cap, cap)


def check_context(ctx: int, limit: int | None) -> int:
    """``ctx`` when the model can run it; the one refusal of a context beyond the model's limit."""
    if limit is not None and ctx > limit:
        raise InputError(f"--ctx {ctx} exceeds the model's max_position_embeddings ({limit}); use --ctx {limit} "
                         "or less")
    return ctx


def decide(spec: Any, board: Board, *, runtime: str | None = None, quant: str | None = None,
           ctx: int | None = None, paging: int | None = None, segments: int | None = None) -> Decision:
    """Runtime, scheme and context for ``spec`` (a ModelSpec) on ``board`` and the user's asks."""
    kind = "encoder" if spec.encoder else "decoder"
    context = default_context(spec.max_position, spec.encoder) if ctx is None else check_context(ctx,
                                                                                                spec.max_position)
    if spec.runtime:
        return as_it_is(spec, board, kind, runtime, quant, context, ctx is None, paging, segments)
    names = candidates(board, kind, runtime)
    asked = normalize_scheme(quant) if quant is not None else None
    fixed = spec.file_scheme if spec.file_format in FIXED_SCHEME_FORMATS else None
    readers = [r for r in names if fixed in board.runtimes[r].schemes and reads_files(board, r, spec.file_format)]
    if fixed and readers and asked in (None, normalize_scheme(fixed)):  # runs as it is: nothing to build
        o = Option(readers[0], normalize_scheme(fixed), None, f"a .{spec.file_format} file runs as it is on "
                   f"{readers[0]}: edgeinfer deploy builds from Hugging Face directories, .onnx and .pt2 files")
        return Decision(kind, o, context, ctx is None, None, paging, segments)
    if fixed and asked is None:
        raise InputError(f"{Path(spec.source).name} is {fixed} and no runtime of board {board.name} runs it "
                         f"({runs_lines(board, names)}); deploy does not convert .{spec.file_format} files",
                         "pass --quant with one of those schemes to plan the model converted, as deploy builds it "
                         "from the model's Hugging Face directory")
    if asked is not None:
        names = [r for r in names if asked.name in board.runtimes[r].schemes]
        if not names:
            raise InputError(f"board {board.name} does not support {asked.name} for {kind} models",
                             f"supported schemes: {runs_lines(board, candidates(board, kind, runtime))}",
                             kind="not_supported")
    options = []
    for r in names:  # up to the first this installation builds: a later runtime is not asked (nor its builder)
        options.append(option(spec, board, r, kind, asked))
        if options[-1].cannot_build is None:
            break
    chosen = options[-1] if options[-1].cannot_build is None else with_alternative(options[0], spec, board, kind)
    best = options[0] if options[0] is not chosen else None
    note = None
    if fixed:  # planned converted, as asked: what deploy would build from the model's source, not from this file
        chosen, note = planned_converted(chosen, fixed, spec.file_format, board, chosen.runtime in readers)
    return Decision(kind, chosen, context, ctx is None, best, paging, segments, note)


def planned_converted(o: Option, fixed: str, file_format: str, board: Board, runs: bool) -> tuple[Option, str]:
    """A file stored in scheme ``fixed`` planned as ``o`` (--quant): ``o`` as deploy sees it (it does not
    convert such files) and the note that says which scheme was planned and why."""
    what = (f"which {o.runtime} runs as it is; " if runs else
            f"which {o.runtime} on {board.name} does not run as it is: ")
    deploy = "" if o.cannot_build else ", what deploy would build from the model's Hugging Face directory"
    note = f"the file is {fixed}, {what}planned as {o.scheme.name} (as --quant asks) from parameter counts{deploy}"
    source = (f"; from the model's Hugging Face directory: {o.cannot_build}" if o.cannot_build
              else ": deploy the model's Hugging Face directory")
    why = f"deploy does not convert .{file_format} files{source}"
    return Option(o.runtime, o.scheme, None, why, asked=True), note


def reads_files(board: Board, runtime: str, file_format: str | None) -> bool:
    """Whether ``runtime`` runs ``file_format`` files as they are: it lists schemes of that format (gguf:Q4_0)."""
    return bool(file_format) and any(s.startswith(f"{file_format}:") for s in board.runtimes[runtime].schemes)


def runs_lines(board: Board, names: list[str]) -> str:
    return "; ".join(f"{r}: {', '.join(board.runtimes[r].schemes)}" for r in names)


def as_it_is(spec: Any, board: Board, kind: str, runtime: str | None, quant: str | None, context: int,
             ctx_default: bool, paging: int | None, segments: int | None) -> Decision:
    """A vendor toolkit's own file (``spec.runtime``: a .rkllm runs in rkllm): planned on that runtime only, in
    the asked scheme or the runtime's default (the file does not record it); nothing to build."""
    if runtime not in (None, spec.runtime):
        raise InputError(f"{spec.name} runs in runtime {spec.runtime} only, not {runtime}", "omit --runtime")
    if spec.runtime not in board.runtimes:
        raise InputError(f"board {board.name} has no runtime '{spec.runtime}'",
                         "runtimes: " + ", ".join(board.runtimes))
    listed = board.runtimes[spec.runtime].schemes
    scheme = normalize_scheme(quant if quant is not None else listed[0])
    if scheme.name not in listed:
        raise InputError(f"board {board.name} does not support {scheme.name} for {kind} models",
                         f"supported schemes: {spec.runtime}: {', '.join(listed)}", kind="not_supported")
    o = Option(spec.runtime, scheme, None, f"a .{spec.file_format} file runs as it is on {spec.runtime}: nothing "
               "to build")
    return Decision(kind, o, context, ctx_default, None, paging, segments)


def candidates(board: Board, kind: str, runtime: str | None) -> list[str]:
    """The board's runtimes for ``kind``, preferred first (``runtime``: only that one, checked)."""
    takes = [r for r in [board.default_runtime, *board.runtimes] if kind in board.runtimes[r].kinds]
    takes = list(dict.fromkeys(takes))
    if not takes:
        raise InputError(f"board {board.name} has no runtime for {kind} models",
                         "runtimes: " + ", ".join(f"{k} ({'/'.join(v.kinds)})" for k, v in board.runtimes.items()),
                         kind="not_supported")
    if runtime is None:
        return takes
    if runtime not in takes:
        raise InputError(f"--runtime {runtime}: board {board.name} runs {kind}s with {', '.join(sorted(takes))}; "
                         "pass one of those")
    return [runtime]


def own_runtime(board: Board) -> str:
    """The board runtime its backend builds without being told (``backend_runtime``)."""
    return board.backend_runtime or board.default_runtime


def option(spec: Any, board: Board, runtime: str, kind: str, asked: Scheme | None) -> Option:
    """``runtime`` for a ``kind`` model: the scheme it gets and whether this installation builds it."""
    listed = board.runtimes[runtime].schemes
    fallback = asked or normalize_scheme("fp16" if kind == "encoder" and "fp16" in listed else listed[0])
    cls, missing = builder(board, runtime, kind)
    missing = missing or unexportable(spec, board, runtime)
    if missing:
        return Option(runtime, fallback, None, missing)
    families = {normalize_scheme(s).family: s for s in listed}
    own = cls.decoders.schemes if kind == "decoder" else encoder_schemes(cls.tensors)
    ok = list(dict.fromkeys(s for s in own if s in families))
    if not ok:
        return Option(runtime, fallback, None, f"board {board.name} lists no scheme that {cls.name} converts "
                      f"{kind}s to (board: {', '.join(listed)}; {cls.name}: {', '.join(own)})")
    if asked is None:
        return Option(runtime, normalize_scheme(ok[0]), cls.name, None)
    if asked.family not in ok:
        return Option(runtime, asked, None, f"--quant {asked.name}: board {board.name} deploys {kind}s as "
                      f"{', '.join(ok)} only (through {cls.name}, runtime {runtime}); pass one of those", asked=True)
    return Option(runtime, asked, cls.name, None)


def encoder_schemes(tensors: Any) -> tuple[str, ...]:
    """The encoder schemes a backend converts to, deploy's default first: fp16 where it converts fp16 (the int8
    schemes need calibration data), else its ``default_scheme``."""
    first = "fp16" if "fp16" in tensors.schemes else tensors.default_scheme
    return tuple(dict.fromkeys((first, *tensors.schemes)))


def builder(board: Board, runtime: str, kind: str) -> tuple[Any, str | None]:
    """(the backend class that builds ``runtime`` for ``kind`` on ``board``, None) or (None, why not)."""
    from edgeinfer.contract import registry  # registers the board's backend: its module, no SDK (test_light_core)

    entry = registry.registry().backend(board.backend)
    own = own_runtime(board)
    if runtime != own and kind == "decoder" and not (entry and runtime in entry.cls.decoders.runtimes):
        owner = registry.runtime_builder(runtime)  # a backend that builds this runtime on every board
        if owner is not None:
            why = owner.cls.cannot_build(kind, runtime)
            return (None, why) if why else (owner.cls, None)
    if entry is None:
        return None, f"backend {board.backend!r} is not installed ({registry.install_hint(board.backend)})"
    if runtime != own and (kind != "decoder" or runtime not in entry.cls.decoders.runtimes):
        return None, f"edgeinfer has no builder for {runtime}: {board.name}'s backend {board.backend} builds {own}"
    why = entry.cls.cannot_build(kind, None if runtime == own else runtime)
    return (None, why) if why else (entry.cls, None)


def with_alternative(o: Option, spec: Any, board: Board, kind: str) -> Option:
    """``o`` (not buildable here) with the runtimes this installation does build for ``kind`` named."""
    others = [r for r in board.runtimes if r != o.runtime and kind in board.runtimes[r].kinds
              and option(spec, board, r, kind, None).cannot_build is None]
    if not others or o.asked:
        return o
    return Option(o.runtime, o.scheme, o.backend, f"{o.cannot_build}; or pass --runtime {' or '.join(others)}")


def summary_lines(p: Any) -> list[str]:
    """A plan (``planner.Plan``) in the few lines ``deploy`` prints before converting: what it builds, the board's
    preferred runtime when that is not it, and a runtime or int8 activations that decode faster here."""
    verdict = "fits" if p.fits else "DOES NOT FIT"
    dec = p.estimates.decode_tokens_per_s
    speed = f", decode ≈ {dec:.3g} tok/s" if dec else ""
    first = (f"plan: {p.model.name} on {p.board.name}: {p.runtime} {p.scheme.name}, ctx {p.ctx}, {verdict} "
             f"({p.total_bytes / 2**30:.2f} of {p.capacity_bytes / 2**30:.2f} GiB{speed})")
    r = p.suggestions.runtime if p.suggestions else None
    a = p.suggestions.activations if p.suggestions else None
    faster = [f"faster here: --runtime {r['runtime']} decodes {p.scheme.name} at ≈ {r['decode_tokens_per_s']:.3g} "
              f"tok/s ({r['speedup']:g}× this build's estimate)"] if r else []
    faster += [f"faster here: --quant {a['quant']} (int8 activations) decodes at ≈ {a['decode_tokens_per_s']:.3g} "
               f"tok/s ({a['speedup']:g}× this build's estimate)"] if a else []
    return [first, *(p.decision.lines()[1:] if p.decision else []), *faster]
