"""Device memory gauges through OpenVINO properties. No NPU or GPU is attached to the test machines: the
NPU/GPU cases use a stand-in for ``Core.get_property`` that answers the documented property names."""

from __future__ import annotations

import pytest
from edgeinfer_openvino import gauges

import edgeinfer

GIB = 1024**3


def npu_gpu_driver_stand_in(device: str, name: str):
    values = {("NPU", "NPU_DEVICE_ALLOC_MEM_SIZE"): 512 * 1024**2, ("NPU", "NPU_DEVICE_TOTAL_MEM_SIZE"): 16 * GIB,
              ("GPU.0", "GPU_DEVICE_TOTAL_MEM_SIZE"): 8 * GIB}
    if (device, name) not in values:
        raise RuntimeError(f"Unsupported property {name} by {device} plugin")
    return values[(device, name)]


def test_npu_and_gpu_memory_cpu_left_out():
    r = gauges.device_readings(npu_gpu_driver_stand_in, ["CPU", "GPU.0", "GPU.1", "NPU"])
    assert [(x.device, x.memory_used_bytes, x.memory_total_bytes, x.utilization) for x in r] == [
        ("GPU.0", None, 8 * GIB, None), ("NPU", 512 * 1024**2, 16 * GIB, None)]


def test_real_core_on_a_cpu_only_machine_reports_nothing():
    import openvino

    if openvino.Core().available_devices != ["CPU"]:
        pytest.skip("this machine has an OpenVINO NPU or GPU")
    assert edgeinfer.backend("openvino").device_readings(["CPU"]) == []
