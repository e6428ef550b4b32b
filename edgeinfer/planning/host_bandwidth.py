"""This machine's memory bandwidth for the ``host`` board: a short copy benchmark, measured once and cached.

Standard library only (``plan`` stays light): copying one bytearray into another of the same length is a
memcpy (``bytearray_setslice_linear`` in CPython's Objects/bytearrayobject.c,
https://github.com/python/cpython/blob/00f6a54d5cfef4879581cd8e43f5d399c534b0e5/Objects/bytearrayobject.c);
the figure is (bytes read + bytes written) / time of the fastest of a few copies, one thread, like STREAM's
Copy. Cached per machine (CPU model, core count, MemTotal) under the edgeinfer cache directory;
``EDGEINFER_HOST_BANDWIDTH_GBPS`` sets it without measuring.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from edgeinfer.errors import InputError

ENV = "EDGEINFER_HOST_BANDWIDTH_GBPS"
COPY_MIB = 256  # well above any CPU's last-level cache, so the copy streams from memory
TRIES = 4
MEASURING = "measuring this machine's memory bandwidth once (~0.5 s)..."


_notes: list[Callable[[str], None]] = []  # who is told before a measurement starts (the CLI in text mode)


@contextmanager
def telling(note: Callable[[str], None]) -> Iterator[None]:
    """Within this block a measurement first calls ``note`` with :data:`MEASURING` (the CLI's text mode)."""
    _notes.append(note)
    try:
        yield
    finally:
        _notes.remove(note)


@dataclass(frozen=True)
class HostBandwidth:
    gbps: float
    source: str
    measured_now: bool = False


def machine() -> dict:
    """What identifies this machine for the cache: CPU model, logical cores, MemTotal (kB)."""
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k.strip() in ("model name", "Hardware", "Model", "cpu model"):
                    cpu = v.strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_total_kb": _meminfo_kb().get("MemTotal")}


def _meminfo_kb() -> dict[str, int]:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if v.strip()}
    except (OSError, ValueError):
        return {}


def copy_mib() -> int:
    """The copy's size: COPY_MIB, or less on a small board (the two buffers stay under a quarter of what is
    available)."""
    avail = _meminfo_kb().get("MemAvailable")
    return COPY_MIB if avail is None else max(16, min(COPY_MIB, avail // 1024 // 8))


def measure_gbps(mib: int = COPY_MIB, tries: int = TRIES) -> float:
    """Best-of-``tries`` copy bandwidth in GB/s (read + write bytes), one thread."""
    n = mib * 2**20
    src = bytearray(b"\x5a") * n  # written, so its pages are real (a fresh zeroed buffer reads the zero page)
    dst = bytearray(n)
    dst[:] = src  # first touch of dst's pages: not timed
    best = math.inf
    for _ in range(tries):
        t = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - t)
    return 2 * n / best / 1e9


def cache_file(facts: dict) -> Path:
    from edgeinfer.contract import cache

    return cache.root() / "host" / f"bandwidth-{cache.key(facts, 16)}.json"


def _override() -> HostBandwidth | None:
    text = os.environ.get(ENV)
    if text is None or not text.strip():
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"{ENV}={text!r} is not a bandwidth", f"set it to GB/s, for example {ENV}=12.5, or unset "
                         "it to measure this machine")
    return HostBandwidth(v, f"set by {ENV} (not measured)")


def _read(path: Path, facts: dict) -> HostBandwidth | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        v = float(d["gbps"])
        if d["machine"] != facts or not math.isfinite(v) or v <= 0:
            return None
        return HostBandwidth(v, _source(d["date"], path))
    except (OSError, ValueError, KeyError, TypeError):  # absent or damaged: measured again
        return None


def _source(day: str, path: Path) -> str:
    return f"measured on this machine by {__name__} (copy benchmark, {day}), cached in {path}"


def host_bandwidth() -> HostBandwidth:
    """The override, else the cached figure, else a measurement (announced, see :func:`telling`) that is then
    cached; a cache that cannot be written only costs the next call a measurement."""
    fixed = _override()
    if fixed:
        return fixed
    facts = machine()
    path = cache_file(facts)
    hit = _read(path, facts)
    if hit:
        return hit
    for note in _notes[-1:]:
        note(MEASURING)
    mib = copy_mib()
    gbps = round(measure_gbps(mib), 2)
    day = date.today().isoformat()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"gbps": gbps, "machine": facts, "date": day,
                                   "method": f"bytearray copy of {mib} MiB, best of {TRIES}"}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        return HostBandwidth(gbps, _source(day, path).replace(", cached in", f", not cached ({e.strerror}) in"),
                             measured_now=True)
    return HostBandwidth(gbps, _source(day, path), measured_now=True)
