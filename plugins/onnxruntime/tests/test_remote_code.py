"""The model builder never gets hf_remote=true (its default) unless the user trusts the directory."""

from __future__ import annotations

import pytest
from edgeinfer_onnxruntime import builder, decoder

from edgeinfer.contract import remote_code
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.remote_code import evil_decoder


def _extra(cmd: list[str]) -> dict[str, str]:
    opts = cmd[cmd.index("--extra_options") + 1:]
    return dict(o.split("=", 1) for o in opts)  # later keys win, as in the builder's parse_extra_options


def test_builder_command_says_hf_remote_false_unless_trusted(tmp_path):
    cmd = builder.builder_command(model_dir(), tmp_path, "fp32", ["hf_remote=true"])  # a scheme cannot undo it
    assert _extra(cmd)["hf_remote"] == "false"
    with remote_code.trusting(True):
        assert _extra(builder.builder_command(model_dir(), tmp_path, "fp32"))["hf_remote"] == "true"


def test_builder_is_not_run_on_a_dir_that_names_code(tmp_path):
    evil = evil_decoder(tmp_path / "evil")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        decoder.convert(evil.path, "fp32", 64, out, None)  # the plugin's own entry, the core check bypassed
    assert not evil.imported and not any(out.iterdir())
