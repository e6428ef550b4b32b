"""What a ``serve --devices`` entry means for an onnxruntime worker (CPU only: an index is the default device)."""

import edgeinfer
from edgeinfer.contract import Placement


def test_an_index_is_the_default_device_and_a_name_the_device():
    backend = edgeinfer.backend("onnxruntime")
    assert backend.placement("0") == Placement()
    assert backend.placement("CPU") == Placement(device="CPU")
