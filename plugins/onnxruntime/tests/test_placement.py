"""What a ``serve --devices`` entry means for an onnxruntime worker (CPU only: an index is the default device)."""

import edgeinfer


def test_an_index_is_the_default_device_and_a_name_the_device():
    backend = edgeinfer.backend("onnxruntime")
    assert backend.placement("0") == ({}, None, {})
    assert backend.placement("CPU") == ({}, "CPU", {})
