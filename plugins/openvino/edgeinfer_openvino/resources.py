"""Intel NPU and GPU as Ray custom resources (edgeinfer/contract/resources.py): one unit per device OpenVINO
lists (``GPU.0``, ``GPU.1`` are two ``intel_gpu``); both share the host's memory here (an integrated GPU)."""

from __future__ import annotations

from edgeinfer.contract import Accelerator, Probe

# the board profile's target (boards/*.yaml) -> the resource its bundles need
RESOURCE_NAMES = {"npu": "intel_npu", "gpu": "intel_gpu"}


def accelerators(probe: Probe) -> list[Accelerator]:
    kinds = [d.upper().split(".")[0] for d in probe.devices]
    return [Accelerator(RESOURCE_NAMES[k.lower()], kinds.count(k), None, "openvino Core.available_devices")
            for k in ("NPU", "GPU") if k in kinds]
