"""edgeinfer.model.kind: every kind of model reference, each from a fixture made here (or the committed tiny
decoder), and one-line errors for a path that is none of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import edgeinfer as run_cli

from edgeinfer.contract.backend import TensorSpec
from edgeinfer.errors import InputError
from edgeinfer.model.bundle import Bundle, Manifest, write
from edgeinfer.model.kind import Kind, find, kind
from edgeinfer.testing import models

TINY_QWEN3 = Path(models.__file__).parent / "data" / "tiny-qwen3"


@pytest.fixture
def onnx_file(tmp_path) -> Path:
    return models.mlp(tmp_path).path


def test_an_onnx_file(onnx_file):
    assert kind(onnx_file) is Kind.ONNX


def test_a_torch_export_program(tmp_path):
    (tmp_path / "model.pt2").write_bytes(b"PK\x03\x04")
    assert kind(tmp_path / "model.pt2") is Kind.PT2


def test_backend_artifacts_stamped_or_by_suffix(tmp_path):
    (tmp_path / "model.rknn").write_bytes(b"RKNN")
    assert kind(tmp_path / "model.rknn") is Kind.NATIVE
    art = tmp_path / "decoder"  # a decoder artifact directory with its stamp beside it (rknn, ascend)
    art.mkdir()
    (art / "rknn-decoder.json").write_text("{}")
    (tmp_path / "decoder.stamp.json").write_text(json.dumps({"backend": "rknn"}))
    assert kind(art) is Kind.NATIVE


def test_hugging_face_directories(tmp_path):
    assert kind(TINY_QWEN3) is Kind.DECODER_DIR  # config.json: Qwen3ForCausalLM
    enc = tmp_path / "bert"
    enc.mkdir()
    (enc / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    assert kind(enc) is Kind.ENCODER_DIR
    (enc / "config.json").write_text("{not json")  # unreadable: not a decoder; the loader says what is wrong
    assert kind(enc) is Kind.ENCODER_DIR


def test_bundles(onnx_file, tmp_path):
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "model.onnx").write_bytes(onnx_file.read_bytes())
    write(enc, Manifest(backend="onnxruntime", board="host", scheme="fp32", artifacts=["model.onnx"],
                        inputs=[TensorSpec("x", ("batch", 16), "float32")],
                        outputs=[TensorSpec("y", ("batch", 8), "float32")], source={"name": "mlp"}))
    Bundle.open(enc)  # a real, valid bundle
    assert kind(enc) is Kind.ENCODER_BUNDLE
    dec = tmp_path / "dec"
    dec.mkdir()
    (dec / "manifest.json").write_text(json.dumps({"schema": "edgeinfer.bundle/1", "decoder": {"context": 64}}))
    assert kind(dec) is Kind.DECODER_BUNDLE
    (dec / "manifest.json").write_text("[1, 2")  # damaged: still a bundle, so that opening it says why
    assert kind(dec) is Kind.ENCODER_BUNDLE
    with pytest.raises(InputError, match="not valid JSON"):
        Bundle.open(dec)


def test_a_path_that_is_none_of_them(tmp_path):
    with pytest.raises(InputError, match=r"^bundle not found: .*nope$"):
        kind(tmp_path / "nope", "bundle")
    assert find(tmp_path / "nope") is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="is not a bundle, a model directory or a backend artifact"):
        kind(tmp_path / "empty")
    assert find(tmp_path / "empty") is None


def test_the_cli_says_so_in_one_line_with_exit_2(tmp_path):
    r = run_cli("profile", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "is not a bundle, a model directory or a backend artifact" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
