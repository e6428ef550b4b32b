"""The one conversion cache: where converted models live, how entries are keyed, sealed and reused.

Under :func:`root` (``$EDGEINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgeinfer``):

* ``deploy/<key>/`` — bundles built by ``edgeinfer deploy``; ``deploy/onnx/<key>/`` — reference exports
* ``artifacts/<backend>/<key>/`` — models converted when ``edgeinfer.load`` is given a non-native file
* ``paged/<backend>/<key>/`` — models split and converted by ``edgeinfer run --paging``

Every key is :func:`key` of the facts that decide the result (source hash, backend, its versions,
scheme, options); every entry is sealed when stored and verified before it is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer import files
from edgeinfer.contract import seal


def root() -> Path:
    return Path(os.environ.get("EDGEINFER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgeinfer"))


def area(name: str) -> Path:
    """One part of the cache: ``deploy``, ``artifacts`` or ``paged``."""
    return root() / name


def key(facts: Any, length: int = 24) -> str:
    """The entry name for ``facts`` (JSON with sorted keys; what is not JSON is written as str)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:length]


def intact(entry: Path) -> bool:
    """Whether ``entry`` may be reused: every file as its seal recorded it at store time."""
    return seal.intact(entry)


def reusable(entry: Path, note: Callable[[str], None]) -> bool:
    """Whether ``entry`` exists and is intact; a damaged or unsealed entry is discarded (and rebuilt)."""
    if not entry.exists():
        return False
    if intact(entry):
        return True
    note(f"discarding a damaged cache entry (files differ from their seal): {entry}")
    shutil.rmtree(entry, ignore_errors=True)
    return False


def seal_entry(entry: Path) -> None:
    """Seal a finished entry in place (verified before every reuse)."""
    seal.seal_dir(entry)


def fill(entry: Path, build: Callable[[Path], None]) -> Path:
    """Make ``entry`` by calling ``build(directory)``, unless an intact one exists. The build writes
    next to the entry, is sealed, then moved into place: a reader (or an interrupted run) sees a whole
    sealed entry or none, and a failed build leaves nothing behind."""
    if intact(entry):
        return entry
    tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        build(tmp)
        seal.seal_dir(tmp)
        if not intact(entry):  # damaged, unsealed or half-written: replace it
            shutil.rmtree(entry, ignore_errors=True)
            try:
                tmp.rename(entry)
            except OSError:  # a concurrent run stored it first
                if not intact(entry):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def store(entry: Path, work: Path) -> None:
    """Copy ``work`` into the cache as ``entry``, sealed, replacing an older entry atomically."""
    tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(work, tmp)
    seal.seal_dir(tmp)
    shutil.rmtree(entry, ignore_errors=True)
    tmp.rename(entry)


def sweep_deploy() -> None:
    """Remove the temporaries of killed runs from the deploy cache (entries and ONNX exports)."""
    base = area("deploy")
    files.sweep(base, cache=True)
    onnx_dir = base / "onnx"
    if onnx_dir.is_dir():
        files.sweep(onnx_dir, cache=True)  # exports being built next to their entries
        for d in onnx_dir.iterdir():
            files.sweep(d, cache=True)
