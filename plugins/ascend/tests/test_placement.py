"""What a ``serve --devices`` entry means for an Ascend worker (no card here: nothing is opened)."""

import edgeinfer


def test_a_card_index_is_the_visible_card_and_its_first_npu():
    backend = edgeinfer.backend("ascend")
    assert backend.placement("3") == ({"ASCEND_RT_VISIBLE_DEVICES": "3"}, "npu:0", {})
    assert backend.placement("npu:1") == ({}, "npu:1", {})
