"""What a ``serve --devices`` entry means for an OpenVINO worker: a device name is the device, an index the
default device (the contract's default rule)."""

import edgeinfer
from edgeinfer.contract import Placement


def test_a_name_is_the_device_and_an_index_the_default_device():
    backend = edgeinfer.backend("openvino")
    assert backend.placement("NPU") == Placement(device="NPU")
    assert backend.placement("0") == Placement()
