"""Bad input through the real CLI (`edgeinfer run ... --backend openvino`): one line on stderr, exit 2
(exit 3 when a known device is absent), and a good run whose outputs match the reference."""

import json

import numpy as np
import openvino as ov
import pytest

import edgeinfer
from edgeinfer.testing import models
from edgeinfer.testing.cli import run_cli

HAS_NPU = "NPU" in ov.Core().available_devices


@pytest.fixture
def edgeinfer_cli(monkeypatch, capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): no interpreter start-up and openvino
    import per call."""

    def run(*args, cache):
        monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(cache))
        return run_cli(capfd, *args)

    return run


def one_line_error(proc, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    m = models.mlp(root, batch=2)
    ir = edgeinfer.backend("openvino").quantize(m.path, "fp32", None, root / "mlp.xml")
    np.save(root / "x.npy", m.feeds["x"])
    return root, m, ir


def test_run_ir_on_cpu_writes_reference_outputs(setup, tmp_path, edgeinfer_cli):
    root, m, ir = setup
    proc = edgeinfer_cli("run", str(ir), "--backend", "openvino", "--device", "CPU", "-i", f"x={root / 'x.npy'}",
                         "--out", str(tmp_path / "out"), "--json", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["backend"] == "openvino" and report["device"] == "CPU"
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), m.reference(m.feeds)["y"], rtol=1e-4, atol=1e-4)


def test_run_onnx_with_backend_openvino_converts_then_runs(setup, tmp_path, edgeinfer_cli):
    root, m, _ = setup
    proc = edgeinfer_cli("run", str(m.path), "--backend", "openvino", "-i", f"x={root / 'x.npy'}", "--json",
                         "--out", str(tmp_path / "out"), cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backend"] == "openvino"
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), m.reference(m.feeds)["y"], rtol=1e-4, atol=1e-4)


def test_unknown_device(setup, tmp_path, edgeinfer_cli):
    root, _, ir = setup
    line = one_line_error(edgeinfer_cli("run", str(ir), "--backend", "openvino", "--device", "FOO",
                                        "--input", f"x={root / 'x.npy'}", cache=tmp_path))
    assert "unknown OpenVINO device 'FOO'" in line and "CPU, GPU, NPU, auto" in line


@pytest.mark.skipif(HAS_NPU, reason="this machine has an NPU")
def test_absent_npu_is_exit_3_with_the_driver_fix(setup, tmp_path, edgeinfer_cli):
    root, _, ir = setup
    line = one_line_error(edgeinfer_cli("run", str(ir), "--backend", "openvino", "--device", "NPU",
                                        "--input", f"x={root / 'x.npy'}", cache=tmp_path), code=3)
    assert "NPU is not available" in line and "linux-npu-driver" in line


def test_corrupt_ir(setup, tmp_path, edgeinfer_cli):
    root = setup[0]
    bad = tmp_path / "bad.xml"
    bad.write_text("<?xml version='1.0'?><net name='x'><layers><layer")
    bad.with_suffix(".bin").write_bytes(b"\1\2\3")
    line = one_line_error(edgeinfer_cli("run", str(bad), "--backend", "openvino", "--input", f"x={root / 'x.npy'}",
                                        cache=tmp_path / "cache"))
    assert "bad.xml is not a readable OpenVINO IR" in line


def test_corrupt_onnx(setup, tmp_path, edgeinfer_cli):
    root = setup[0]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 not an onnx protobuf at all")
    line = one_line_error(edgeinfer_cli("run", str(bad), "--backend", "openvino", "--input", f"x={root / 'x.npy'}",
                                        cache=tmp_path / "cache"))
    assert "bad.onnx is not a readable model" in line


def test_deploy_int8_with_calibration_of_wrong_input_names(setup, tmp_path, edgeinfer_cli):
    """`edgeinfer deploy ... --board core-ultra-155h` (a board served by this backend) with a calibration
    .npz whose key is not a model input: one line naming the bad input, exit 2, no bundle."""
    _, m, _ = setup
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((4, 2, 16), np.float32))
    line = one_line_error(edgeinfer_cli("deploy", str(m.path), "--board", "core-ultra-155h", "-q", "int8",
                                        "--calib", str(bad), "-o", str(tmp_path / "bundle"), "--no-cache",
                                        cache=tmp_path / "cache"))
    assert "unknown input 'input'" in line and "x" in line
    assert not (tmp_path / "bundle").exists()
