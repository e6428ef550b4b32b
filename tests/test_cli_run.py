"""`edgeinfer run` through the real CLI (in this process: edgeinfer.testing.cli.run_cli): outputs, JSON, and
one-line errors with exit 2."""

import functools
import json

import numpy as np
import pytest
from helpers import edgeinfer

from edgeinfer.testing import models
from edgeinfer.testing.cli import run_cli


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return models.mlp(tmp_path_factory.mktemp("m"), batch=2)


@pytest.fixture
def cli(capfd):
    return functools.partial(run_cli, capfd)


def _one_line_error(proc, code=2):
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_run_writes_outputs_equal_to_reference(mlp, tmp_path, cli):
    np.save(tmp_path / "x.npy", mlp.feeds["x"])
    out = tmp_path / "out"
    proc = cli("run", str(mlp.path), "--input", f"x={tmp_path / 'x.npy'}", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # stdout is only JSON
    assert report["backend"] == "onnxruntime"
    assert report["outputs"] == [{"name": "y", "shape": [2, 8], "dtype": "float32", "non_finite": 0}]
    np.testing.assert_allclose(np.load(out / "y.npy"), mlp.reference(mlp.feeds)["y"], rtol=1e-5, atol=1e-6)


def test_missing_model_file(tmp_path, cli):
    line = _one_line_error(cli("run", str(tmp_path / "nope.onnx")))
    assert "not found" in line


def test_corrupt_onnx(mlp, tmp_path, cli):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an onnx protobuf")
    np.save(tmp_path / "x.npy", mlp.feeds["x"])  # a good input: the model file itself must be what is refused
    line = _one_line_error(cli("run", str(bad), "--input", f"x={tmp_path / 'x.npy'}"))
    assert "bad.onnx is not a valid ONNX model" in line and "Protobuf parsing failed" in line, line
    assert "export the model to ONNX again" in line, line


@pytest.mark.parametrize(
    "name,array,needle",
    [
        ("z", np.zeros((2, 16), np.float32), "unknown input 'z'"),
        ("x", np.zeros((2, 16), np.float64), "expected dtype float32, got float64"),
        ("x", np.zeros((2, 3), np.float32), r"expected shape [2, 16], got [2, 3]"),
    ],
)
def test_bad_feeds_write_nothing(mlp, tmp_path, name, array, needle, cli):
    np.save(tmp_path / "in.npy", array)
    out = tmp_path / "out"
    line = _one_line_error(cli("run", str(mlp.path), "-i", f"{name}={tmp_path / 'in.npy'}", "--out", str(out)))
    assert needle in line
    assert not out.exists()


def test_missing_input_file_and_malformed_pair(mlp, tmp_path, cli):
    assert "file not found" in _one_line_error(cli("run", str(mlp.path), "-i", f"x={tmp_path}/no.npy"))
    assert "NAME=FILE.npy" in _one_line_error(cli("run", str(mlp.path), "-i", "x"))


def test_debug_shows_the_traceback(tmp_path):
    """The interpreter prints the traceback of what --debug lets through: a real process."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    proc = edgeinfer("--debug", "run", str(bad))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_version(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and "0.1.0" in proc.stdout


def test_run_on_a_decoder_points_to_generate(tmp_path, tiny_qwen3_host_bundle, cli):
    from edgeinfer.testing.llm import model_dir

    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 4), dtype=np.int64))
    for model in (model_dir(), tiny_qwen3_host_bundle):
        proc = cli("run", str(model), "--input", f"input_ids={x}")
        _one_line_error(proc, 2)
        assert "language (decoder) model" in proc.stderr and f"edgeinfer generate {model}" in proc.stderr
