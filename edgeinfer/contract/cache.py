"""The one conversion cache: where converted models live, how entries are keyed, sealed and reused.

Under :func:`root` (``$EDGEINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgeinfer``):

* ``deploy/<key>/`` — bundles built by ``edgeinfer deploy``; ``deploy/onnx/<key>/`` — reference exports
* ``artifacts/<backend>/<key>/`` — models converted when ``edgeinfer.load`` is given a non-native file
* ``paged/<backend>/<key>/`` — models split and converted by ``edgeinfer run --paging``
* ``locks/`` — one lock file per entry being built (:func:`locked`): processes building the same entry take turns
* other areas hold what is not a conversion: the host's measured bandwidth (``host/``), llama.cpp's source for the
  llamacpp plugin (``llama.cpp/``), the test suite's models, benchmark bundles

``edgeinfer cache`` lists the areas with what they take on disk; ``edgeinfer cache clear`` removes the
conversions (:data:`REBUILT`), entry by entry (``--older-than``: those not built or used since), leaving alone any
entry a running process holds the lock of. After each build the conversions are kept under
``$EDGEINFER_CACHE_MAX_GB`` (:func:`bound`): the least recently built or used go first.

Every key is :func:`key` of the facts that decide the result (source hash, backend, its versions and its
code, scheme, options); every entry is sealed when stored and verified before it is reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
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


def source_digest(dirs: list[Path]) -> str:
    """sha256 over the ``*.py`` files under ``dirs`` (relative path and bytes): changes with any code change."""
    h = hashlib.sha256()
    for d in dirs:
        for f in sorted(d.rglob("*.py")):
            h.update(f"{d.name}/{f.relative_to(d)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def code(obj: Any) -> str:
    """The digest of the sources of the package that defines ``obj``'s class (a backend's plugin), or of ``obj``'s
    package when it is a module: a conversion cached by another code of the same version (a source tree, an
    editable install) is not reused."""
    import importlib
    import types

    module = obj.__name__ if isinstance(obj, types.ModuleType) else type(obj).__module__
    top = importlib.import_module(module.split(".")[0])
    where = getattr(top, "__file__", None)
    if not where:  # a namespace package, or code typed into ``python -c``
        return ""
    # a package: its folder; a plugin that is one module: that file (not the folder it was installed into)
    return _digest(Path(where).parent if hasattr(top, "__path__") else Path(where))


def made_by(backend: Any) -> dict[str, Any]:
    """The facts of a conversion key that name what converts: the backend, its versions and its plugin's code."""
    return {"backend": backend.name, "versions": backend.versions(), "code": code(backend)}


@lru_cache(maxsize=None)
def _digest(path: Path) -> str:
    if path.is_dir():
        return source_digest([path])[:16]
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:  # not a file on disk (a module imported from a zip archive): keyed by its versions only
        return ""


def intact(entry: Path) -> bool:
    """Whether ``entry`` may be reused: every file as its seal recorded it at store time. An intact entry is
    about to be reused: its folder's modification time becomes now (what ``edgeinfer cache clear --older-than``
    reads: the last build or use)."""
    if not seal.intact(entry):
        return False
    with suppress(OSError):  # a read-only cache is still reused
        os.utime(entry)
    return True


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


@contextmanager
def locked(entry: Path, wait: bool = True) -> Iterator[bool]:
    """Hold ``entry``'s lock for the body: an exclusive ``flock`` (https://man7.org/linux/man-pages/man2/flock.2.html)
    on ``locks/<name>-<hash of its path>.lock``. Processes that check-then-build the same entry inside it take
    turns, so the second finds the first one's result instead of converting the same model again; the kernel
    drops the lock when its holder exits, killed or not. Not re-entrant: never take an entry's lock twice in one
    process (a second ``flock`` on a new open file waits for the first). The holder removes the file (and an
    empty ``locks/``) on the way out; a waiter that then holds the lock of a removed file opens the path again.
    With ``wait=False`` the body runs at once and is told whether it holds the lock (False: another process does).
    An entry that is new when the body ends (a build) is kept under the cache's bound (:func:`bound`)."""
    path = area("locks") / f"{entry.name}-{key(str(entry.resolve()), 16)}.lock"
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = open(path, "a")
        except FileNotFoundError:  # locks/ removed by a holder on its way out meanwhile
            continue
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            yield False
            return
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    before = _inode(entry)
    try:
        yield True
        after = _inode(entry) if wait else None
        if after is not None:  # built or reused under this lock: what the bound's "least recently used" reads
            with suppress(OSError):
                os.utime(entry)
            if after != before:  # built (or rebuilt)
                bound(keep=entry)
    finally:
        path.unlink(missing_ok=True)
        with suppress(OSError):  # other locks in it
            path.parent.rmdir()
        f.close()  # releases the lock


def _inode(entry: Path) -> int | None:
    try:
        return entry.lstat().st_ino
    except OSError:
        return None


def fill(entry: Path, build: Callable[[Path], None]) -> Path:
    """Make ``entry`` by calling ``build(directory)``, unless an intact one exists, holding its lock
    (:func:`locked`). The build writes next to the entry, is sealed, then moved into place: a reader (or an
    interrupted run) sees a whole sealed entry or none, and a failed build leaves nothing behind."""
    if intact(entry):
        return entry
    with locked(entry):
        if not intact(entry):  # built by another process while this one waited
            _fill(entry, build)
    return entry


def _fill(entry: Path, build: Callable[[Path], None]) -> None:
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
            except OSError:  # a concurrent run (of an edgeinfer without the lock) stored it first
                if not intact(entry):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def store(entry: Path, work: Path) -> None:
    """Copy ``work`` into the cache as ``entry``, sealed, replacing an older entry atomically. A caller that
    checks :func:`reusable` and then builds holds :func:`locked` around both and this."""
    tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    files.copy_tree(work, tmp)
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


# --- what the cache holds, and clearing it (``edgeinfer cache``) ----------------------------------------

#: the areas of conversions, rebuilt from their sources when needed: what ``edgeinfer cache clear`` removes when
#: no area is named
REBUILT = ("deploy", "artifacts", "paged")
_BY_BACKEND = ("artifacts", "paged")  # their entries sit in a folder per backend


def areas() -> list[str]:
    """The areas present under :func:`root`, ``locks/`` aside."""
    base = root()
    return sorted(p.name for p in base.iterdir() if p.is_dir() and p.name != "locks") if base.is_dir() else []


def _listing(folder: Path) -> list[Path]:
    """``folder``'s contents, sorted; none when another process removed it meanwhile (its last entry cleared)."""
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _holders(name: str) -> list[Path]:
    """The folders of area ``name`` that hold its entries: the area, or its backends' folders; ``deploy/onnx``."""
    base = area(name)
    if name in _BY_BACKEND:
        return [p for p in _listing(base) if p.is_dir()]
    return [base, base / "onnx"] if name == "deploy" and (base / "onnx").is_dir() else [base]


def entries(name: str) -> list[Path]:
    """The entries of area ``name``: what one build makes and one lock guards (``deploy/onnx/`` holds the
    reference exports, one entry each)."""
    return [e for h in _holders(name) for e in _listing(h) if e != area("deploy") / "onnx"]


def usage() -> list[dict[str, Any]]:
    """Per area: its path, entries, bytes on disk (hard links once) and whether ``clear`` removes it by default."""
    return [{"area": n, "path": str(area(n)), "entries": len(entries(n)), "bytes": files.disk_bytes(area(n)),
             "rebuilt": n in REBUILT} for n in areas()]


def clear(names: list[str], dry_run: bool = False, older_than_s: float | None = None) -> dict[str, Any]:
    """Remove every entry of the areas ``names`` that no running process is building (its lock held, or a temporary
    of a live process) and, with ``older_than_s``, that was not built or used (:func:`intact`) since; what was
    (or, ``dry_run``, would be) freed, and the entries left because a process is building them."""
    removed, busy, freed = 0, [], 0
    cutoff = None if older_than_s is None else time.time() - older_than_s
    for name in names:
        for e in entries(name):
            with suppress(OSError):
                if cutoff is not None and e.lstat().st_mtime > cutoff:
                    continue
            size = _remove(e, dry_run)
            if size is None:
                busy.append(str(e))
                continue
            freed += size
            removed += 1
        if not dry_run:
            _drop_empty_holders(name)
    return {"areas": names, "removed_entries": removed, "freed_bytes": freed, "busy": busy, "dry_run": dry_run,
            "older_than_s": older_than_s}


def _remove(e: Path, dry_run: bool = False) -> int | None:
    """Remove entry ``e`` unless a running process is building it (None); the bytes it took on disk."""
    if files.owner_of(e.name, legacy=True) is not None and not files.is_stale(e, legacy=True):
        return None  # a build's temporary, its process still running
    with locked(e, wait=False) as held:
        if not held:
            return None
        if not e.exists() and not e.is_symlink():  # another process removed it meanwhile
            return 0
        size = files.disk_bytes(e)
        if not dry_run:  # an error is raised, not ignored: the bytes counted must be the bytes freed
            if e.is_dir() and not e.is_symlink():
                shutil.rmtree(e)
            else:
                e.unlink()
        return size


def _drop_empty_holders(name: str) -> None:
    if not area(name).is_dir():
        return
    for h in _holders(name):  # a backend's folder, deploy/onnx: gone with its last entry
        if h != area(name):
            with suppress(OSError):  # still holds a busy entry
                h.rmdir()


MAX_ENV = "EDGEINFER_CACHE_MAX_GB"
DEFAULT_MAX_GB = 50


def max_bytes() -> int | None:
    """The bound on what the conversions (:data:`REBUILT`) take on disk: ``$EDGEINFER_CACHE_MAX_GB`` (GB of
    10^9 bytes; default 50), or None for ``off``."""
    from edgeinfer.errors import InputError

    raw = os.environ.get(MAX_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_GB * 10**9
    if raw.lower() == "off":
        return None
    try:
        gb = float(raw)
    except ValueError:
        gb = float("nan")
    if not 0 < gb < float("inf"):
        raise InputError(f"{MAX_ENV} must be a size in GB above 0, or off; got {raw!r}",
                         f"e.g. export {MAX_ENV}={DEFAULT_MAX_GB}")
    return int(gb * 10**9)


def conversions_bytes() -> int:
    return sum(files.disk_bytes(area(n)) for n in REBUILT)


def bound(keep: Path | None = None) -> dict[str, Any] | None:
    """Keep the conversions under :func:`max_bytes` (:func:`shrink`), ``keep`` aside: what a build calls. Says on
    stderr what it removed; returns that (None when nothing was over)."""
    import sys

    limit = max_bytes()
    total = conversions_bytes() if limit is not None else 0
    if limit is None or total <= limit:
        return None
    r = shrink(limit, keep, total=total)
    for e, err in r["failed"]:  # not ours to remove (permissions): the build that called this still stands
        print(f"edgeinfer: could not remove cache entry {e}: {err}", file=sys.stderr)
    over = "" if r["bytes"] <= limit else "; still over: the rest is in use or the entry just built"
    print(f"edgeinfer: the conversion cache was over {MAX_ENV}={limit / 1e9:g}: removed {len(r['removed'])} least "
          f"recently used entries, {r['freed_bytes'] / 1e9:.2f} GB ({r['bytes'] / 1e9:.2f} GB now{over})",
          file=sys.stderr)
    return r


def shrink(limit: int, keep: Path | None = None, dry_run: bool = False, total: int | None = None) -> dict[str, Any]:
    """Remove the conversions' least recently built or used entries (an entry's folder time, :func:`intact`) until
    they take at most ``limit`` bytes on disk, passing over ``keep`` and any entry a running process is building
    (``busy``) or that cannot be removed (``failed``). ``dry_run``: what would go (freed bytes counted per entry).
    ``total``: the conversions' bytes, when the caller has just measured them."""
    total = before = conversions_bytes() if total is None else total
    removed: list[str] = []
    busy: list[str] = []
    failed: list[tuple[str, str]] = []
    kept = None if keep is None else keep.resolve()
    for e in sorted((e for n in REBUILT for e in entries(n)), key=_mtime):
        if total <= limit:
            break
        if e.resolve() == kept:
            continue
        try:
            size = _remove(e, dry_run)
        except OSError as err:
            failed.append((str(e), str(err)))
            total = conversions_bytes()
            continue
        if size is None:
            busy.append(str(e))
            continue
        removed.append(str(e))
        total = total - size if dry_run else conversions_bytes()
    if not dry_run:
        for n in REBUILT:
            _drop_empty_holders(n)
    return {"removed": removed, "busy": busy, "failed": failed, "freed_bytes": before - total, "bytes": total,
            "max_bytes": limit, "dry_run": dry_run}


def _mtime(e: Path) -> float:
    try:
        return e.lstat().st_mtime
    except OSError:
        return 0.0
