"""Shared by the benchmarks: where results go and how they are written, and an RSS sampler
(the definitions of RSS and peak are edgeinfer.contract.measure's)."""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

from edgeinfer.contract.measure import current_rss_bytes

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path


def rss() -> int:
    """Resident set size of this process now (Linux /proc; the benchmarks that sample it need Linux)."""
    n = current_rss_bytes()
    if n is None:
        raise SystemExit("this benchmark reads RSS from /proc/self/statm, which this system does not have")
    return n


class RssSampler:
    """Largest RSS seen (every 2 ms) between start and stop: the peak of one phase in a process that
    may not reset its high-water mark (edgeinfer.contract.measure.reset_peak_rss needs /proc/self/clear_refs)."""

    def __init__(self) -> None:
        self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, rss())
