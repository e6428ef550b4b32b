"""Where a deploy writes: ``-o`` checked first, the bundle built next to it and moved into place at the end
(shared by the encoder and decoder deploys)."""

from __future__ import annotations

import os
import shutil
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
    d = p.to_dict()
    keep = ("fits", "memory", "estimates", "runtime", "scheme")
    return {k: d[k] for k in keep if k in d}


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
