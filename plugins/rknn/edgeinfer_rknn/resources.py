"""The Rockchip NPU as a Ray custom resource (edgeinfer/contract/resources.py): ``<soc>_npu: 1`` on a board
whose device tree names the SoC; it shares the board's memory."""

from __future__ import annotations

from edgeinfer.contract import Accelerator, Probe

from .targets import QUANT_SUPPORT

# the board profile's target (boards/*.yaml) -> the resource its bundles need
RESOURCE_NAMES = {soc: f"{soc}_npu" for soc in QUANT_SUPPORT}


def accelerators(probe: Probe) -> list[Accelerator]:
    soc = probe.details.get("soc")
    if probe.details.get("mode") != "board" or not soc:
        return []  # the simulator is no NPU
    return [Accelerator(f"{soc}_npu", 1, None, "device tree (/proc/device-tree/compatible)")]
