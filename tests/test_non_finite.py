"""NaN and Inf are never a pass: golden and deploy fail naming the output, run --json reports them as valid JSON."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from edgeinfer.deploy import golden
from edgeinfer.testing.cli import run_cli


def _sqrt_model(path):
    """y = sqrt(x * w), w = 1, x: [1, 4] float32 — NaN exactly where x < 0, a real ONNX model run by onnxruntime."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Sqrt", ["xw"], ["y"])], "sqrt",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"bare {token} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def sqrt_onnx(tmp_path_factory):
    return _sqrt_model(tmp_path_factory.mktemp("sqrt") / "sqrt.onnx")


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): exit codes, messages and JSON."""
    return functools.partial(run_cli, capfd)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {"EDGEINFER_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_compare_fails_on_non_finite_candidate_and_names_the_output(bad):
    ref = [{"emb": np.ones((1, 4), np.float32), "ok": np.ones((1, 2), np.float32)}]
    cand = [{"emb": np.array([[1, 1, bad, 1]], np.float32), "ok": np.ones((1, 2), np.float32)}]
    report = golden.compare(ref, cand, [{"x": np.zeros((1, 4))}], 0.99)
    assert report["passed"] is False
    assert report["outputs"]["emb"]["non_finite"] is True
    assert "cosine_min" in report["outputs"]["ok"]  # the finite output is still measured
    line = golden.summary_line(report)
    assert "FAILED" in line and "output emb" in line and "NaN/Inf" in line
    assert "output emb" in golden.worst_samples_line(report)


def test_compare_fails_when_the_reference_itself_is_nan():
    ref = [{"y": np.array([[np.nan, 1.0]], np.float32)}]
    report = golden.compare(ref, ref, [{"x": np.zeros((1, 2))}], 0.99)
    assert report["passed"] is False
    assert "reference" in report["outputs"]["y"]["error"]


def test_nan_threshold_cannot_pass():
    ref = [{"y": np.ones((1, 3), np.float32)}]
    assert golden.compare(ref, ref, [{"x": np.zeros((1, 3))}], float("nan"))["passed"] is False


def test_deploy_of_a_model_giving_nan_fails_and_writes_no_bundle(sqrt_onnx, tmp_path, env, cli):
    np.savez(tmp_path / "g.npz", x=np.array([[-1, 4, 9, 16]], np.float32))
    out = tmp_path / "b"
    proc = cli("deploy", str(sqrt_onnx), "--board", "host", "--golden-inputs", str(tmp_path / "g.npz"),
                     "-o", str(out), "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "output y" in lines[0] and "NaN/Inf" in lines[0], proc.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".edgeinfer-")]


def test_golden_fails_on_nan_and_run_json_reports_it(sqrt_onnx, tmp_path, env, cli):
    np.savez(tmp_path / "good.npz", x=np.array([[1, 4, 9, 16]], np.float32))
    bundle = tmp_path / "b"
    proc = cli("deploy", str(sqrt_onnx), "--board", "host", "--golden-inputs", str(tmp_path / "good.npz"),
                     "-o", str(bundle), env=env)
    assert proc.returncode == 0, proc.stderr

    np.savez(tmp_path / "neg.npz", x=np.array([[1, -4, 9, 16]], np.float32))
    proc = cli("golden", str(bundle), "--inputs", str(tmp_path / "neg.npz"), "--reference", str(sqrt_onnx),
                     "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    report = _strict_json(proc.stdout)
    assert report["passed"] is False and report["outputs"]["y"]["non_finite"] is True
    assert "output y" in proc.stderr

    np.save(tmp_path / "neg.npy", np.array([[1, -4, -9, 16]], np.float32))
    proc = cli("run", str(bundle), "-i", f"x={tmp_path / 'neg.npy'}", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = _strict_json(proc.stdout)
    assert report["outputs"] == [{"name": "y", "shape": [1, 4], "dtype": "float32", "non_finite": 2}]
    assert "output y holds 2 NaN/Inf" in proc.stderr


def test_print_json_never_writes_bare_nan(capsys):
    from edgeinfer.cli.output import print_json

    print_json({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}})
    assert _strict_json(capsys.readouterr().out) == {"a": None, "b": [1.5, None], "c": {"d": None}}


def test_run_refuses_token_ids_outside_the_vocabulary_before_running(tmp_path, cli):
    from edgeinfer.testing import models

    m = models.embedding(tmp_path, vocab=32)
    for ids in ([[0, 1, 2, 3, 4, 32]], [[0, -1, 2, 3, 4, 5]]):
        np.save(tmp_path / "ids.npy", np.array(ids, np.int64))
        proc = cli("run", str(m.path), "-i", f"ids={tmp_path / 'ids.npy'}", "--out", str(tmp_path / "o"))
        assert proc.returncode == 2, proc.stderr
        assert "vocabulary [0, 32)" in proc.stderr
        assert not (tmp_path / "o").exists()
    np.save(tmp_path / "ids.npy", np.array([[0, 1, 2, 3, 4, 31]], np.int64))
    proc = cli("run", str(m.path), "-i", f"ids={tmp_path / 'ids.npy'}", "--json")
    assert proc.returncode == 0, proc.stderr
