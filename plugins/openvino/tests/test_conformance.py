"""The core's conformance kit against the OpenVINO backend (real OpenVINO on this machine's CPU)."""

from edgeinfer.testing import BackendConformance


class TestOpenVinoConformance(BackendConformance):
    backend_name = "openvino"
    device = "CPU"


class TestOpenVinoConformanceAuto(BackendConformance):
    """Device ``auto`` (NPU > GPU > CPU from the real device list) and fp16 weights."""

    backend_name = "openvino"
    device = "auto"
    scheme = "fp16"
    rtol = 1e-2
    atol = 1e-2
    load_options = {"hint": "THROUGHPUT"}
