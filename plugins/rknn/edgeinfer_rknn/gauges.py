"""NPU load for /metrics, from the RKNPU driver's ``load`` file (debugfs, or procfs on kernels built with
``CONFIG_ROCKCHIP_RKNPU_PROC_FS``).

The driver (``rknpu_load_show`` in ``drivers/rknpu/rknpu_debugger.c`` of Rockchip's BSP kernel, e.g.
https://github.com/orangepi-xunlong/linux-orangepi) prints ``NPU load: `` then, on multi-core NPUs,
`` Core<i>: <pct>%,`` per core, or on a single-core NPU just ``<pct>%``. The NPU shares the board's DDR,
so there is no separate NPU memory figure: the process RSS gauges cover it. debugfs needs root (or a
readable mount); without it there is simply no gauge.
"""

from __future__ import annotations

import re
from pathlib import Path

from edgeinfer.contract.backend import DeviceReading

LOAD_FILES = ("sys/kernel/debug/rknpu/load", "proc/debug/rknpu/load")
_CORE = re.compile(r"Core(\d+):\s*(\d+)%")
_SINGLE = re.compile(r"NPU load:\s*(\d+)%")


def parse_load(text: str) -> dict[str, float]:
    """``{"core0": 0.21, ...}`` (or ``{"npu": ...}`` for a single-core NPU) from the ``load`` file. A core whose
    figure is above 100 % (older drivers overflowed, e.g. ``Core2: 429496%``) is left out: its load is unknown."""
    if not text.lstrip().startswith("NPU load:"):
        raise ValueError(f"not an RKNPU load line: {text.strip()[:80]!r}")
    cores = {f"core{i}": int(pct) for i, pct in _CORE.findall(text)}
    if not cores:
        single = _SINGLE.search(text)
        cores = {"npu": int(single.group(1))} if single else {}
    return {name: pct / 100.0 for name, pct in cores.items() if pct <= 100}


def readings(root: Path = Path("/")) -> list[DeviceReading]:
    """The NPU cores' load now; [] when no ``load`` file is readable (no RKNPU driver, or not root)."""
    for rel in LOAD_FILES:
        try:
            text = (root / rel).read_text(errors="replace")
        except OSError:
            continue
        return [DeviceReading(name, utilization=u) for name, u in parse_load(text).items()]
    return []
