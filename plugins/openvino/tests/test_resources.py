"""Intel NPU / GPU as Ray custom resources, from probes whose device lists are the real one here and recorded
stand-ins of machines that are not here (as in test_devices.py)."""

from __future__ import annotations

import edgeinfer
from edgeinfer.contract import Probe

RECORDED_CORE_ULTRA_DEVICES_standin = ["CPU", "GPU", "NPU"]
RECORDED_TWO_GPUS_standin = ["CPU", "GPU.0", "GPU.1"]


def _resources(devices: list[str]) -> dict[str, int]:
    backend = edgeinfer.backend("openvino")
    return {a.resource: a.count for a in backend.accelerators(Probe(True, devices=devices))}


def test_core_ultra_standin_has_one_npu_and_one_gpu():
    assert _resources(RECORDED_CORE_ULTRA_DEVICES_standin) == {"intel_npu": 1, "intel_gpu": 1}


def test_two_gpus_standin_counts_two():
    assert _resources(RECORDED_TWO_GPUS_standin) == {"intel_gpu": 2}


def test_this_machines_real_probe_cpu_only_offers_nothing():
    backend = edgeinfer.backend("openvino")
    probe = backend.probe()
    want = {"NPU", "GPU"} & {d.split(".")[0] for d in probe.devices}
    assert {a.resource for a in backend.accelerators(probe)} == {f"intel_{k.lower()}" for k in want}
