"""Ascend chips as Ray custom resources (edgeinfer/contract/resources.py): one ``ascend_<series>`` unit per
chip ``npu-smi info`` lists (an Atlas 300I Duo card is two 310P chips), with that chip's memory."""

from __future__ import annotations

import re
from typing import Any

from edgeinfer.contract import Accelerator, Probe

# board family (boards/*.yaml) -> the chip series its bundles need
RESOURCE_NAMES = {"atlas-300i": "ascend_310p", "atlas-910b": "ascend_910b", "ascend-310b": "ascend_310b"}
_SERIES = re.compile(r"^(?:ascend)?\s*(\d{3}[a-z]?)", re.IGNORECASE)


def resource_name(chip_name: str) -> str | None:
    """``910B4`` -> ``ascend_910b``, ``310P3`` -> ``ascend_310p``, ``Ascend910`` (A3) -> ``ascend_910``."""
    m = _SERIES.match(chip_name.strip())
    return f"ascend_{m.group(1).lower()}" if m else None


def accelerators(probe: Probe) -> list[Accelerator]:
    smi = probe.details.get("npu_smi")
    if not isinstance(smi, dict):  # a string saying why npu-smi gave nothing
        return []
    chips: dict[str, list[dict[str, Any]]] = {}
    for chip in smi.get("chips", []):
        name = resource_name(str(chip.get("name", "")))
        if name:
            chips.setdefault(name, []).append(chip)
    out = []
    for name, found in sorted(chips.items()):
        totals = [c["memory_total_mb"] for c in found if c.get("memory_total_mb")]
        memory = min(totals) * 2**20 if totals else None  # the smallest chip: what every replica can count on
        out.append(Accelerator(name, len(found), memory, "npu-smi info"))
    return out
