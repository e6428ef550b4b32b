"""The rknn decoder export (model and tokenizer) gives transformers trust_remote_code only when trusted."""

from __future__ import annotations

import pytest
from edgeinfer_rknn import decoder_export, decoder_segments

from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder


def test_model_and_tokenizer_loads_refuse_a_dir_that_names_code(tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    evil_tok = evil_decoder(tmp_path / "evil-tok", naming_file="tokenizer_config.json")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        decoder_segments.load_hf(evil.path)  # the plugin's own loaders, the core check bypassed
    with pytest.raises(remote_code.RemoteCodeRefused, match="AutoTokenizer -> modeling_evil.EvilTokenizer"):
        decoder_export.CalibrationFeeds(None, evil_tok.path, [], 16, 64, {}, ["calibration text"])
    assert not evil.imported and not evil_tok.imported
