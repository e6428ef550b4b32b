"""The edgeinfer conformance kit against the real rknn-toolkit2 and its simulator."""

from edgeinfer.testing import BackendConformance


class TestRknnConformance(BackendConformance):
    backend_name = "rknn"
    quantize_options = {"target": "rk3588"}
    pass_shapes = True  # RKNN needs static shapes
    # the simulator computes in fp16: kit models have O(1..10) values
    rtol = 2e-2
    atol = 2e-2
