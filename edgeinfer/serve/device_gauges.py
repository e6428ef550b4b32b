"""Device gauges for /metrics: utilisation and memory of the accelerators behind the served backends, and the
resident memory of the server and its workers.

Each backend reads its own devices (:meth:`edgeinfer.contract.backend.Backend.device_readings`: npu-smi on
Ascend, the RKNPU debugfs load on Rockchip, OpenVINO's device memory properties); this collector calls them
lazily at scrape time, at most every ``ttl_s`` seconds, and drops a backend whose reader fails, so a missing
tool or an unreadable file never fails the scrape.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from edgeinfer.contract.backend import DeviceReading
from edgeinfer.contract.measure import current_rss_bytes

UTILIZATION = "edgeinfer_device_utilization_ratio"
MEMORY_USED = "edgeinfer_device_memory_used_bytes"
MEMORY_TOTAL = "edgeinfer_device_memory_total_bytes"
PROCESS_RSS = "edgeinfer_process_rss_bytes"
NAMES = (UTILIZATION, MEMORY_USED, MEMORY_TOTAL, PROCESS_RSS)

Reader = Callable[[], list[DeviceReading]]


def backend_readers(backends: Sequence[str], devices: Sequence[str]) -> dict[str, Reader]:
    """One reader per served backend: its ``device_readings`` over the ``--devices`` entries."""
    from edgeinfer.contract import registry as plugins

    def reader(name: str) -> Reader:
        return lambda: plugins.get_backend(name).device_readings(list(devices))

    return {name: reader(name) for name in sorted(set(backends))}


class DeviceGauges:
    """A prometheus_client custom collector: ``edgeinfer_device_*{device}`` from ``readers`` (backend name →
    reader; the label is ``backend:device``) and ``edgeinfer_process_rss_bytes{process}`` for this process and
    the pids ``processes()`` returns (name → pid)."""

    def __init__(self, readers: dict[str, Reader], processes: Callable[[], dict[str, int]] | None = None,
                 ttl_s: float = 5.0):
        self.readers = readers
        self.processes = processes or dict
        self.ttl_s = ttl_s
        self._cache: tuple[float, list[tuple[str, DeviceReading]]] | None = None
        self._lock = threading.Lock()

    def readings(self) -> list[tuple[str, DeviceReading]]:
        """(backend, reading) for every device a reader reported, at most ``ttl_s`` seconds old."""
        with self._lock:
            if self._cache is not None and time.monotonic() - self._cache[0] < self.ttl_s:
                return self._cache[1]
            rows: list[tuple[str, DeviceReading]] = []
            for backend, read in self.readers.items():
                try:
                    rows += [(backend, r) for r in read()]
                except Exception:  # noqa: BLE001 - an absent tool, an unreadable file: no gauge, never a failed scrape
                    continue
            self._cache = (time.monotonic(), rows)
            return rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily(UTILIZATION, "Busy fraction of the device (0..1) as its driver reports it.",
                                 labels=["device"])
        used = GaugeMetricFamily(MEMORY_USED, "Device memory in use as its driver reports it.", labels=["device"])
        total = GaugeMetricFamily(MEMORY_TOTAL, "Device memory size as its driver reports it.", labels=["device"])
        for backend, r in self.readings():
            label = [f"{backend}:{r.device}"]
            for family, value in ((util, r.utilization), (used, r.memory_used_bytes),
                                  (total, r.memory_total_bytes)):
                if value is not None:
                    family.add_metric(label, float(value))
        yield util
        yield used
        yield total
        yield self._rss()

    def _rss(self) -> GaugeMetricFamily:
        rss = GaugeMetricFamily(PROCESS_RSS, "Resident memory of the server process and of each worker.",
                                labels=["process"])
        for name, pid in {"server": os.getpid(), **self.processes()}.items():
            value = current_rss_bytes(pid)
            if value is not None:
                rss.add_metric([name], float(value))
        return rss


def worker_pids(pool: Any) -> Callable[[], dict[str, int]]:
    """``processes`` for :class:`DeviceGauges`: the live workers of ``pool`` as ``worker<index>``."""
    return lambda: {f"worker{w.index}": w.pid for w in pool.workers if w.pid and w.state in ("idle", "busy")}
