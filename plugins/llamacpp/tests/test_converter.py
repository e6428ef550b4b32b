"""llama.cpp's converter passes trust_remote_code=True to AutoTokenizer in several vocab paths (conversion/base.py
in llama-cpp-python 0.3.36's vendor/llama.cpp): nothing a model directory names runs without --trust-remote-code."""

from __future__ import annotations

import pytest
from edgeinfer_llamacpp import convert, hf_to_gguf

from edgeinfer.contract import remote_code
from edgeinfer.testing.remote_code import evil_decoder


def test_the_converter_is_not_run_on_a_dir_that_names_code(tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        convert.to_f32_gguf(evil.path)  # the plugin's own entry, the core's check bypassed
    assert not evil.imported


def test_the_converters_own_trust_remote_code_true_is_replaced_by_the_users_choice(tmp_path, monkeypatch):
    """What the converter's ``AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`` does once the wrapper
    has set the user's choice: not trusted, the tokenizer's named code is not imported; trusted, it is."""
    import transformers

    originals = {n: getattr(transformers, n).__dict__["from_pretrained"] for n in hf_to_gguf.AUTO_CLASSES}

    def restore():  # the wrapper patches transformers for its own process: undone here
        for name, original in originals.items():
            monkeypatch.setattr(getattr(transformers, name), "from_pretrained", original)

    restore()
    evil = evil_decoder(tmp_path / "evil", naming_file="tokenizer_config.json")
    hf_to_gguf.force_trust(False)
    try:
        transformers.AutoTokenizer.from_pretrained(str(evil.path), trust_remote_code=True)
    except Exception:  # refused or loaded without the code: either way, not imported
        pass
    assert not evil.imported
    restore()
    hf_to_gguf.force_trust(True)
    transformers.AutoTokenizer.from_pretrained(str(evil.path), trust_remote_code=False)
    assert evil.imported  # the user's choice decides, whatever the converter passes
