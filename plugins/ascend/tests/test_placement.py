"""What a ``serve --devices`` entry means for an Ascend worker (no card here: nothing is opened)."""

import edgeinfer
from edgeinfer.contract import Placement


def test_a_card_index_is_the_visible_card_and_its_first_npu():
    backend = edgeinfer.backend("ascend")
    assert backend.placement("3") == Placement(env={"ASCEND_RT_VISIBLE_DEVICES": "3"}, device="npu:0")
    assert backend.placement("npu:1") == Placement(device="npu:1")
