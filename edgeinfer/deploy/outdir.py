"""Where a deploy writes: ``-o`` checked first, the bundle built next to it and moved into place at the end,
the plan recorded in it; or, with ``--dry-run``, nothing (shared by the encoder and decoder deploys)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer import files
from edgeinfer.errors import InputError
from edgeinfer.model.kind import find


def check_out_dir(out_dir: Path) -> None:
    """-o must be a new directory, an empty one or a bundle (replaced), and writable: checked first."""
    files.check_output_dir(out_dir, "-o")
    found = find(out_dir)
    if out_dir.exists() and not (found and found.bundle) and any(out_dir.iterdir()):
        raise InputError(f"{out_dir} exists and is not a bundle; choose an empty or new directory for -o")


def plan_summary(p: Any) -> dict[str, Any]:
    """What the manifest and ``deploy --json`` record of the plan: the build decision, verdict, memory, speed."""
    d = p.to_dict()
    keep = ("options", "build", "fits", "memory", "estimates")
    return {k: d[k] for k in keep if k in d}


def requires(backend: Any, decoder: bool, text: bool) -> list[str]:
    """The distributions a bundle of ``backend`` runs with (the manifest's ``requires``): the core with the extra
    its tokenizer needs, and the backend's plugin with the extras its ``Tensors`` / ``Decoders`` record names."""
    from edgeinfer.contract import registry

    core = "edgeinfer[llm]" if decoder else "edgeinfer[text]" if text else "edgeinfer"
    entry = registry.registry().backend(backend.name)
    if entry is None or entry.plugin.distribution == "?":  # a backend without distribution metadata
        return [core]
    extras = (backend.decoders if decoder else backend.tensors).extras
    return [core, entry.plugin.distribution + (f"[{','.join(extras)}]" if extras else "")]


@dataclass
class DryRun:
    """What ``deploy --dry-run`` answers: the plan deploy would build for; nothing converted or written."""

    plan: Any  # planning.planner.Plan

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": True, "board": self.plan.board.name, "fits": self.plan.fits, "plan": self.plan.to_dict()}


def leave_out_simulation(work: Path, backend: Any, manifest: Any) -> None:
    """``deploy --board-only``: take out of the bundle in ``work`` the files only the backend's simulator on this
    machine reads (:meth:`~edgeinfer.contract.backend.Backend.simulation_files`) and name them in the manifest's
    ``left_out``; the caller then writes the manifest (which seals what is left)."""
    from edgeinfer.model import bundle as bundle_mod

    root = work.resolve()
    gone = backend.simulation_files(work)
    runs = {(work / a).resolve() for a in manifest.artifacts} | {root / bundle_mod.MANIFEST}
    wrong = [f for f in gone if not f.resolve().is_relative_to(root) or not f.is_file() or f.resolve() in runs]
    if wrong:  # a plugin's bug: never remove what is not a file of this bundle, nor what the board runs
        raise ValueError(f"backend {backend.name} names {wrong[0]} as a file only its simulator reads: it is not a "
                         f"file of {work}, or it is one the board runs")
    for f in gone:
        f.unlink()
    manifest.left_out = sorted(f.resolve().relative_to(root).as_posix() for f in gone)


def tmp_parent(out_dir: Path) -> Path:
    return out_dir.resolve().parent  # created (by files.temp_dir) only once there is a bundle to build


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished bundle into place; an older bundle at ``dst`` is replaced only now."""
    if dst.exists():
        old = dst.with_name(dst.name + f".old{os.getpid()}")
        dst.rename(old)
        src.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        src.rename(dst)
