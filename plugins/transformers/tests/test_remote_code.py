"""The decoder reference gives transformers trust_remote_code only when the user trusts the model."""

from __future__ import annotations

import pytest

import edgeinfer
from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder


def test_open_decoder_refuses_a_dir_that_names_code(tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        edgeinfer.backend("transformers").open_decoder(evil.path, None, 64, 1)  # the primitive, no core check
    assert not evil.imported

