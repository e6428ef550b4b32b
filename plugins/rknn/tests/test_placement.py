"""What a ``serve --devices`` entry means for an RKNN worker (no board here: nothing is opened)."""

import edgeinfer
from edgeinfer.contract import Placement


def test_an_entry_is_the_npu_core_mask():
    backend = edgeinfer.backend("rknn")
    assert backend.placement("1") == Placement(options={"core_mask": "1"})
    assert backend.placement("0_1") == Placement(options={"core_mask": "0_1"})
