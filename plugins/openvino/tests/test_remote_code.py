"""optimum-intel's export and NNCF's reload are given trust_remote_code only when the user trusts the model."""

from __future__ import annotations

import pytest
from edgeinfer_openvino import decoder_export

from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder


def test_export_refuses_a_dir_that_names_code(tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        decoder_export.base_export(evil.path, tmp_path / "cache")  # the plugin's own call, no core check first
    with pytest.raises(remote_code.RemoteCodeRefused):
        decoder_export.convert(evil.path, "w8a16", 64, tmp_path / "out", None, {}, tmp_path / "cache")
    assert not evil.imported and not (tmp_path / "out").exists()
