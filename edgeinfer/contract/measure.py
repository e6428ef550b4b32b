"""Measurement: resident memory and latency statistics, one definition of each.

Memory, in bytes:

- :func:`current_rss_bytes` — resident set size now (``/proc/PID/statm``), of this or another process.
- :func:`peak_rss_bytes` — **the peak**: the largest RSS of this process since it started, or since
  the last :func:`reset_peak_rss`. On Linux that is the kernel's high-water mark ``VmHWM``
  (``/proc/self/status``); elsewhere ``getrusage(RUSAGE_SELF).ru_maxrss``, which cannot be reset.
- :func:`reset_peak_rss` — set the high-water mark to the current RSS (writes ``5`` to
  ``/proc/self/clear_refs``), so that a peak can be taken per phase (per batch size in ``bench``);
  False where the system cannot, and then a caller reports no per-phase peak rather than a wrong one.

Why ``VmHWM`` and not ``ru_maxrss`` on Linux: the reset lowers both, but ``ru_maxrss`` also carries
the peak from before an exec (in a fork + exec child that is a copy of the parent's memory), so a
fresh subprocess would report its parent's peak.

Latency: :func:`latency_stats` — nearest-rank percentiles (an observed value, never an
interpolation) over samples in milliseconds.

Other work: :func:`others_busy_cpus` between two :func:`cpu_sample` — how many CPUs other processes (and, in a
virtual machine, its host: steal time) kept busy while something was timed, from ``/proc/stat`` less this
process's own CPU time. A speed figure taken while that is high reads low, and says so.

Imports only the standard library: the core and plugins import it and ``edgeinfer plan`` stays light.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path


def latency_stats(samples_ms: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99, min, max of ``samples_ms`` (at least one sample)."""
    xs = sorted(samples_ms)

    def pct(p: float) -> float:
        k = max(0, min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1))
        return xs[k]

    return {
        "mean": statistics.fmean(xs),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "min": xs[0],
        "max": xs[-1],
    }


def current_rss_bytes(pid: int | None = None) -> int | None:
    """Resident set size of ``pid`` (default: this process) now; None where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid or 'self'}/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int:
    """Largest resident set size of this process since it started or since :func:`reset_peak_rss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def reset_peak_rss() -> bool:
    """Lower the high-water mark of :func:`peak_rss_bytes` to the current RSS; False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


MIN_LOAD_WINDOW_S = 0.2  # the kernel counts CPU time in ticks of 10 ms: a shorter window says little


def cpu_sample() -> tuple[float, float, float] | None:
    """(wall seconds, CPU seconds the whole machine has been busy, this process's CPU seconds) now, for
    :func:`others_busy_cpus`; None without ``/proc/stat`` (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError):
        return None
    if fields[0] != "cpu" or len(ticks) < 8:
        return None
    own = os.times()
    busy = sum(ticks[:3]) + sum(ticks[5:8])
    return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system


def others_busy_cpus(before: tuple[float, float, float] | None,
                     after: tuple[float, float, float] | None) -> float | None:
    """The CPUs other work kept busy between two :func:`cpu_sample`: the machine's busy time less this process's,
    over the wall time (0 at the least); None without both samples or over less than MIN_LOAD_WINDOW_S."""
    if before is None or after is None or after[0] - before[0] < MIN_LOAD_WINDOW_S:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return round(max(0.0, others) / (after[0] - before[0]), 2)


def most_busy(figures: Iterable[float | None]) -> float | None:
    """The highest of several :func:`others_busy_cpus` figures that are known, or None."""
    return max((f for f in figures if f is not None), default=None)


def busy_note(others: float | None, cpus: int | None = None) -> str | None:
    """One line where other work kept at least half a CPU and a quarter of this machine's busy while a figure was
    timed, else None."""
    cpus = cpus or os.cpu_count() or 1
    if others is None or others < max(0.5, cpus / 4):
        return None
    return (f"other work kept {others:.2g} of this machine's {cpus} CPUs busy while it was timed: its speed "
            "figures may read low; run it again on an idle machine")
