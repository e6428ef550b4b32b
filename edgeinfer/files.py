"""Files edgeinfer writes: output paths checked before any work, and temporaries a killed run
does not leave behind for good.

Every temporary edgeinfer creates next to the user's files or in its cache is named
``.edgeinfer-<kind>-<pid>-<created>-<random>``: the owning process and when it made it. A run that
is interrupted (SIGINT, SIGTERM) removes its own temporaries on the way out; a run that could not
(SIGKILL, power loss) leaves them for the next run, whose ``sweep`` removes every temporary whose
owner is gone — never one that a concurrent run is still writing.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from edgeinfer.errors import InputError

PREFIX = ".edgeinfer-"
_OURS = re.compile(r"^\.edgeinfer-[a-z]+-(?P<pid>\d+)-(?P<created>\d+)-")
_LEGACY = re.compile(r"\.tmp(?P<pid>\d+)$|^\.[^/]+\.(?P<pid2>\d+)\.tmp$")  # cache store / ONNX export of 0.x
_LEGACY_RANDOM = re.compile(r"^\.edgeinfer-(deploy-)?[a-z0-9_]{8}$")  # tempfile names without an owner
LEGACY_MAX_AGE_S = 24 * 3600
#: kernel interfaces, not storage: a write there fails or does something else than store a file. /dev/null
#: too: every output is staged next to its target and renamed into place, which no device node allows.
#: /dev/shm is a plain tmpfs.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
STORAGE_UNDER_PSEUDO = ("/dev/shm",)


# --- output paths ---------------------------------------------------------------------------------


def check_output_dir(path: Path, option: str) -> None:
    """Refuse an output directory edgeinfer could not create or write, before any work is done."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path} is an existing file, not a directory; choose a directory path")
    _check_creatable(path, option)


def check_output_file(path: Path, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """Refuse an output file path edgeinfer could not write, before any work is done."""
    if path.is_dir():
        raise InputError(f"{option} {path} is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise InputError(f"{option} {path} is not a regular file (a device, pipe or socket); give a file path")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(f"{option} {path}: the file name must end in {', '.join(suffixes)}")
    _check_creatable(path.parent if path.is_file() else path, option)  # an existing file is overwritten


def _check_creatable(path: Path, option: str) -> None:
    """The nearest existing ancestor must be a directory we may write into, on storage."""
    _check_storage(path, option)
    target = path if path.exists() else path.parent
    probe = Path(os.path.abspath(target))
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{option} {path} cannot be created: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path} is not writable (no write permission on {probe}); choose another path")


def _check_storage(path: Path, option: str) -> None:
    real = os.path.realpath(path)  # symlinks too: /dev/stdout -> /proc/self/fd/1
    for root in PSEUDO_ROOTS:
        inside = real == root or real.startswith(root + "/")
        if inside and not any(real == s or real.startswith(s + "/") for s in STORAGE_UNDER_PSEUDO):
            raise InputError(f"{option} {path} is under {root}, a kernel interface, not storage; "
                             "choose a path on a disk")


# --- temporaries ------------------------------------------------------------------------------------


def temp_name(kind: str) -> str:
    """``.edgeinfer-<kind>-<pid>-<created>-<random>``: recognisable, with its owner and age."""
    return f"{PREFIX}{kind}-{os.getpid()}-{int(time.time())}-{secrets.token_hex(4)}"


@contextmanager
def temp_dir(parent: Path, kind: str) -> Iterator[Path]:
    """A fresh directory in ``parent``, removed on the way out whatever happens (KeyboardInterrupt too)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / temp_name(kind)
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def temp_file(final: Path, kind: str) -> Iterator[Path]:
    """A temporary path next to ``final`` (same filesystem, so it can be renamed into place);
    removed on the way out unless the caller moved it (with the folder made for it, if left empty)."""
    made = not final.parent.exists()
    final.parent.mkdir(parents=True, exist_ok=True)
    path = final.parent / (temp_name(kind) + final.suffix)
    try:
        yield path
    finally:
        _remove(path)
        if made:
            try:
                final.parent.rmdir()  # only succeeds when empty: nothing was moved into place
            except OSError:
                pass


def owner_of(name: str, legacy: bool = False) -> tuple[int, float | None] | None:
    """(pid, creation time or None) of one of our temporaries, None for any other name;
    ``legacy`` also reads the names older versions used in the cache (never in a user's directory)."""
    m = _OURS.match(name)
    if m:
        return int(m["pid"]), float(m["created"])
    m = _LEGACY.search(name) if legacy else None
    if m:
        return int(m["pid"] or m["pid2"]), None
    return None


def owner_alive(pid: int, created: float | None) -> bool:
    """Whether process ``pid`` (which made a temporary at ``created``) may still be using it."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    started = _process_start(pid)
    # the pid was reused by a process started after the temporary was made: its owner is gone
    return not (created is not None and started is not None and started > created + 1)


def _process_start(pid: int) -> float | None:
    """Start time (epoch seconds) of ``pid`` from /proc; None where /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        stat = Path("/proc/stat").read_text().splitlines()
        btime = next(int(ln.split()[1]) for ln in stat if ln.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def is_stale(path: Path, legacy: bool = False) -> bool:
    owner = owner_of(path.name, legacy)
    if owner is not None:
        return not owner_alive(*owner)
    if _LEGACY_RANDOM.match(path.name):  # no owner recorded: only when clearly abandoned
        try:
            return time.time() - path.lstat().st_mtime > LEGACY_MAX_AGE_S
        except OSError:
            return False
    return False


def sweep(directory: Path, cache: bool = False) -> list[Path]:
    """Remove the temporaries in ``directory`` whose owner is gone; return what was removed.
    ``cache``: the directory is edgeinfer's own cache, where older versions' names are recognised too."""
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for p in entries:
        if (p.name.startswith(PREFIX) or owner_of(p.name, cache)) and is_stale(p, cache):
            _remove(p)
            removed.append(p)
    return removed


def remove_own(directory: Path) -> None:
    """Remove this process's temporaries in ``directory`` (on the way out of an interrupted step)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for p in entries:
        owner = owner_of(p.name, legacy=True)
        if owner is not None and owner[0] == os.getpid():
            _remove(p)


def _remove(p: Path) -> None:
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    except OSError:
        pass


# --- bundles with the same bytes more than once -------------------------------------------------------


def link_duplicates(root: Path, min_bytes: int = 1 << 20) -> int:
    """Hard-link the files under ``root`` that hold the same bytes to one copy (a bucketed bundle's IRs share one
    weights file, byte for byte, once per bucket); the bytes saved. Files under ``min_bytes`` are left alone."""
    by_size: dict[int, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and (size := p.stat().st_size) >= min_bytes:
            by_size.setdefault(size, []).append(p)
    saved = 0
    for size, group in by_size.items():
        if len(group) < 2:
            continue
        first: dict[str, Path] = {}
        for p in group:
            same = first.setdefault(sha256_of(p), p)
            if same != p and not os.path.samefile(same, p):
                tmp = p.with_name(temp_name("link"))
                try:
                    os.link(same, tmp)
                except OSError:  # a file system without hard links (FAT, exFAT, some network shares)
                    return saved
                os.replace(tmp, p)
                saved += size
    return saved


def copy_tree(src: Path, dst: Path, **copytree_args) -> None:
    """``shutil.copytree`` that keeps files hard-linked to each other in ``src`` hard-linked in ``dst``."""
    firsts: dict[tuple[int, int], str] = {}

    def copy(s: str, d: str) -> str:
        st = os.stat(s)
        if st.st_nlink > 1:
            first = firsts.setdefault((st.st_dev, st.st_ino), d)
            if first != d:
                with suppress(OSError):  # else a copy: a file system without hard links
                    os.link(first, d)
                    return d
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy, **copytree_args)


def disk_bytes(root: Path) -> int:
    """What ``root`` takes on disk (allocated blocks, as ``du``), a file hard-linked several times counted once."""
    if root.is_symlink() or not root.is_dir():
        return root.lstat().st_blocks * 512 if root.exists() or root.is_symlink() else 0
    seen: set[tuple[int, int]] = set()
    total = 0
    for d, dirs, names in os.walk(root):
        for name in (*dirs, *names):
            with suppress(OSError):  # removed meanwhile
                st = os.lstat(os.path.join(d, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes (``edgeinfer.contract.stamp.sha256_file`` also takes a directory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
