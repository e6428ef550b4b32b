"""Device memory for /metrics through OpenVINO's read-only device properties.

- NPU: ``NPU_DEVICE_ALLOC_MEM_SIZE`` (memory allocated on the NPU, as the driver reports it) and
  ``NPU_DEVICE_TOTAL_MEM_SIZE`` (https://docs.openvino.ai/2025/api/c_cpp_api/group__ov__runtime__npu__prop__cpp__api.html).
- GPU: ``GPU_DEVICE_TOTAL_MEM_SIZE`` only. ``GPU_MEMORY_STATISTICS`` counts the allocations of the ``Core`` that
  asks (https://docs.openvino.ai/2023.2/namespaceov_1_1intel_gpu.html), and the models live in the worker
  processes, not in the server process that answers the scrape: it would read ~0.
- CPU: nothing here; the process RSS gauges cover it.

OpenVINO has no utilisation property for any device (neither the NPU nor the GPU property list has one), so
there is no utilisation gauge for OpenVINO devices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from edgeinfer.contract.backend import DeviceReading

NPU_USED, NPU_TOTAL = "NPU_DEVICE_ALLOC_MEM_SIZE", "NPU_DEVICE_TOTAL_MEM_SIZE"
GPU_TOTAL = "GPU_DEVICE_TOTAL_MEM_SIZE"


def _prop(get_property: Callable[[str, str], Any], device: str, name: str) -> float | None:
    try:
        value = get_property(device, name)
    except Exception:  # noqa: BLE001 - a driver or plugin version without this property
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def device_readings(get_property: Callable[[str, str], Any], available: Sequence[str]) -> list[DeviceReading]:
    """Memory of every NPU and GPU in ``available`` (``Core.available_devices``) through ``get_property``
    (``Core.get_property``); devices that report neither figure are left out."""
    out = []
    for device in available:
        family = device.split(".")[0].upper()
        if family == "NPU":
            used, total = _prop(get_property, device, NPU_USED), _prop(get_property, device, NPU_TOTAL)
        elif family == "GPU":
            used, total = None, _prop(get_property, device, GPU_TOTAL)
        else:
            continue
        if used is not None or total is not None:
            out.append(DeviceReading(device, memory_used_bytes=used, memory_total_bytes=total))
    return out


@functools.lru_cache(maxsize=1)
def _core() -> Any:
    import openvino

    return openvino.Core()


def readings() -> list[DeviceReading]:
    core = _core()
    return device_readings(core.get_property, list(core.available_devices))
