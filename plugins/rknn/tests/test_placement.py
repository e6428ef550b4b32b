"""What a ``serve --devices`` entry means for an RKNN worker (no board here: nothing is opened)."""

import edgeinfer


def test_an_entry_is_the_npu_core_mask():
    backend = edgeinfer.backend("rknn")
    assert backend.placement("1") == ({}, None, {"core_mask": "1"})
    assert backend.placement("0_1") == ({}, None, {"core_mask": "0_1"})
