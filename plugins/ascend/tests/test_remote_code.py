"""The ascend decoder (convert and open) gives transformers trust_remote_code only when trusted."""

from __future__ import annotations

import pytest

from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder


def test_convert_and_open_refuse_a_dir_that_names_code(ascend, tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        ascend.convert_decoder(evil.path, "fp16", 64, tmp_path / "out")  # the primitives, no core check first
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        ascend.open_decoder(evil.path, None, 64, 1)
    assert not evil.imported and not (tmp_path / "out").exists()
