"""rknn backend against the real rknn-toolkit2 and its simulator (no board here: the board
path is checked through stand-in file trees and recorded runtime output, named as such)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from edgeinfer_rknn import device as hw
from edgeinfer_rknn import session
from edgeinfer_rknn import toolkit as tk

import edgeinfer
from edgeinfer.contract import CalibrationSet, stamp
from edgeinfer.errors import EdgeInferError, FeedError, InputError, ModelError
from edgeinfer.testing import models as kit_models


@pytest.fixture(scope="module")
def backend():
    return edgeinfer.backend("rknn")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = tmp_path_factory.mktemp("rknn-kit-models")
    return {m.name: m for m in kit_models.all_models(root)}


def _custom_op_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("FooBar", ["r"], ["y"], domain="my.dom")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.dom", 1)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


# --- import stays light -------------------------------------------------------------------------
def test_import_does_not_load_the_toolkit_or_torch():
    code = ("import sys, edgeinfer_rknn; "
            "print(sorted(m for m in ('rknn', 'rknnlite', 'torch', 'onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_probe_reports_simulator_mode(backend):
    p = backend.probe()
    assert p.available, p.problems
    assert p.details["mode"] == "simulator"
    assert p.devices == ["simulator"]
    assert p.versions["rknn-toolkit2"] == backend.versions()["rknn-toolkit2"]
    assert p.details["targets"]["rk3588"] == ["fp16", "w8a8"]


# --- conversion errors --------------------------------------------------------------------------
def test_w4a16_on_rk3588_names_what_it_supports(backend, kit, tmp_path):
    out = tmp_path / "m.rknn"
    calib = CalibrationSet([kit["mlp"].feeds])
    with pytest.raises(InputError, match=r"rk3588 does not support w4a16.*it supports: fp16, w8a8"):
        backend.quantize(kit["mlp"].path, "w4a16", calib, out, shapes={"x": [2, 16]})
    assert not out.exists()


def test_w4a16_on_rk3576_converts(backend, tmp_path):
    m = kit_models.mlp(tmp_path, batch=2, seed=5)
    rng = np.random.default_rng(0)
    calib = CalibrationSet([{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(4)])
    art = backend.quantize(m.path, "w4a16", calib, tmp_path / "m.rknn", target="rk3576")
    data = stamp.read(art)
    assert data["target"] == "rk3576" and data["scheme"] == "w4a16" and data["quantized_dtype"] == "w4a16"


def test_dynamic_shape_without_shapes_is_a_clear_error(backend, kit, tmp_path):
    with pytest.raises(InputError, match=r"static input shapes.*shapes="):
        backend.quantize(kit["mlp_dynamic"].path, None, None, tmp_path / "m.rknn")


def test_int8_without_calibration_is_a_clear_error(backend, kit, tmp_path):
    with pytest.raises(InputError, match="calibration"):
        backend.quantize(kit["mlp"].path, "int8", None, tmp_path / "m.rknn", shapes={"x": [2, 16]})


def test_unknown_option_and_target(backend, kit, tmp_path):
    with pytest.raises(InputError, match="unknown option.*bogus"):
        backend.quantize(kit["mlp"].path, None, None, tmp_path / "m.rknn", bogus=1)
    with pytest.raises(InputError, match="unknown RKNN target 'rk9999'"):
        backend.quantize(kit["mlp"].path, None, None, tmp_path / "m.rknn", target="rk9999")


def test_corrupt_onnx_is_a_clear_error(backend, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all" * 10)
    out = tmp_path / "bad.rknn"
    with pytest.raises(ModelError, match="not a valid ONNX model") as err:
        backend.quantize(bad, None, None, out)
    assert "\n" not in err.value.one_line()
    assert not out.exists() and not tk.sidecar(out).exists() and not stamp.stamp_path(out).exists()
    assert not tk.source_model(out).exists()


def test_unsupported_operator_is_listed(backend, tmp_path):
    model = _custom_op_model(tmp_path / "custom.onnx")
    out = tmp_path / "custom.rknn"
    with pytest.raises(ModelError, match=r"operators rknn-toolkit2 cannot convert: FooBar \(domain my.dom\)"):
        backend.quantize(model, None, None, out)
    assert not out.exists()


def test_toolkit_failure_leaves_no_artifact_and_keeps_the_log(backend, kit, tmp_path):
    """A failure inside the toolkit (here: calibration of an int8 build fed a dataset with a
    file that is not a valid .npy) gives a one-line error, no .rknn, no build inputs, and the log."""
    m = kit["mlp"]
    out = tmp_path / "m.rknn"
    calib = CalibrationSet([{"x": np.zeros((2, 16), np.float32)}])
    # a stale artifact from an earlier conversion must not survive a failed one
    out.write_bytes(b"old")
    orig = tk.write_calibration

    def broken_calibration(calibration, inputs, folder):  # corrupt the .npy the toolkit will read
        n = orig(calibration, inputs, folder)
        for f in (folder / "calib").glob("*.npy"):
            f.write_bytes(b"garbage")
        return n

    tk_mod = sys.modules["edgeinfer_rknn.toolkit"]
    tk_mod.write_calibration = broken_calibration
    try:
        with pytest.raises(EdgeInferError) as err:
            backend.quantize(m.path, "w8a8", calib, out, shapes={"x": [2, 16]})
    finally:
        tk_mod.write_calibration = orig
    msg = err.value.one_line()
    assert "\n" not in msg and f"rknn-toolkit2 could not convert {m.path.name}" in msg and str(tk.log_path(out)) in msg, msg
    assert not out.exists() and not tk.sidecar(out).exists() and not stamp.stamp_path(out).exists()
    assert not tk.source_model(out).exists()
    assert not list(tmp_path.glob(".m.rknn.partial-*")), "temporary build folder left behind"
    assert tk.log_path(out).exists() and tk.log_path(out).stat().st_size > 0


# --- fp16 on the simulator, fusion-rule retry, log capture ----------------------------------------
@pytest.fixture(scope="module")
def attention_art(backend, kit, tmp_path_factory):
    m = kit["attention"]
    out = tmp_path_factory.mktemp("rknn-att") / "attention.rknn"
    return backend.quantize(m.path, None, None, out, shapes={k: list(v.shape) for k, v in m.feeds.items()})


def test_fusion_rule_crash_is_retried_and_reported(attention_art):
    """rknn-toolkit2 2.5.0 crashes in several reshape/sdpa fusion rules on the kit's attention
    block; the conversion disables each rule it crashed in and says so in the stamp."""
    data = stamp.read(attention_art)
    assert data["retried_without_rules"], "expected at least one fusion rule crash on this model"
    assert data["disabled_rules"] == data["retried_without_rules"]
    log = tk.log_path(attention_art).read_text(errors="replace")
    for rule in data["retried_without_rules"]:
        assert f"disable_rules=['{rule}']" in log or f"Rule: {rule}" in log


def test_log_captures_toolkit_output_at_fd_level(backend, kit, tmp_path, capfd):
    m = kit["two_in_two_out"]
    out = tmp_path / "t.rknn"
    backend.quantize(m.path, None, None, out, shapes={k: list(v.shape) for k, v in m.feeds.items()})
    with backend.load(out) as s:
        s.run(m.feeds)
    seen = capfd.readouterr()
    assert "rknn" not in (seen.out + seen.err).lower(), "toolkit output leaked past the capture"
    log = tk.log_path(out).read_text(errors="replace")
    assert "rknn-toolkit2 version" in log  # Python logger
    assert "Target is None, use simulator" in log or "simulator" in log.lower()


def test_calibration_layout_in_build_inputs(backend, kit, tmp_path):
    m = kit["two_in_two_out"]
    rng = np.random.default_rng(1)
    samples = [{k: rng.standard_normal(v.shape).astype(np.float32) for k, v in m.feeds.items()} for _ in range(3)]
    art = backend.quantize(m.path, "w8a8", CalibrationSet(samples), tmp_path / "q.rknn",
                           shapes={k: list(v.shape) for k, v in m.feeds.items()}, quantized_algorithm="kl")
    with tarfile.open(tk.sidecar(art)) as tf:
        lines = tf.extractfile("dataset.txt").read().decode().split("\n")
        lines = [ln for ln in lines if ln]
        assert len(lines) == 3
        for i, ln in enumerate(lines):
            paths = ln.split(" ")
            assert len(paths) == 2  # one .npy per input, space-separated, input order
            for k, (p, name) in enumerate(zip(paths, m.feeds)):
                arr = np.load(io.BytesIO(tf.extractfile(p).read()))
                np.testing.assert_array_equal(arr, samples[i][name])
        recipe = json.loads(tf.extractfile("recipe.json").read())
    assert recipe["algorithm"] == "kl" and recipe["calibration_samples"] == 3
    data = stamp.read(art)
    assert data["quantized_algorithm"] == "kl_divergence" and data["calibration_samples"] == 3


def test_two_models_open_in_one_process(backend, kit, attention_art, tmp_path):
    """rknn-toolkit2 2.5.0's simulator holds several built models at once (checked here, since
    older versions could not)."""
    a = kit["attention"]
    e = kit["embedding"]
    e_art = backend.quantize(e.path, None, None, tmp_path / "e.rknn", shapes={k: list(v.shape) for k,
                                                                              v in e.feeds.items()})
    with backend.load(attention_art) as s1, backend.load(e_art) as s2:
        y1 = s1.run(a.feeds)["y"]
        y2 = s2.run(e.feeds)["y"]
        y1b = s1.run(a.feeds)["y"]
    np.testing.assert_allclose(y1, a.reference(a.feeds)["y"], rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y2, e.reference(e.feeds)["y"], rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(y1, y1b)


def test_simulator_rebuild_matches_and_profile_is_labelled(backend, kit, attention_art):
    a = kit["attention"]
    # first load after conversion may reuse the built model; a second load rebuilds from the recipe
    with backend.load(attention_art) as s:
        first = s.run(a.feeds)["y"]
    with backend.load(attention_art) as s:
        again = s.run(a.feeds)["y"]
        prof = s.profile(a.feeds, repeat=3)
    np.testing.assert_allclose(again, first, rtol=1e-3, atol=1e-3)
    assert prof.notes["simulator"] is True and prof.notes["note"] == "simulator figures, not board speed"
    assert prof.ops == []


def test_simulator_needs_build_inputs(backend, attention_art, tmp_path):
    copy = tmp_path / "lonely.rknn"
    copy.write_bytes(attention_art.read_bytes())
    with pytest.raises(InputError, match="simulator cannot run lonely.rknn by itself"):
        backend.load(copy)


def test_swapped_artifact_is_refused(backend, attention_art, tmp_path):
    copy = tmp_path / "swapped.rknn"
    copy.write_bytes(attention_art.read_bytes() + b"\0")
    tk.sidecar(copy).write_bytes(tk.sidecar(attention_art).read_bytes())
    with pytest.raises(InputError, match="does not match its build inputs"):
        backend.load(copy)


def test_load_options(backend, attention_art):
    with pytest.raises(InputError, match="unknown core_mask"):
        backend.load(attention_art, core_mask="7")
    with pytest.raises(EdgeInferError, match="needs a Rockchip board"):
        backend.load(attention_art, device="npu")


# --- hybrid quantization ------------------------------------------------------------------------
def test_hybrid_keeps_named_layer_in_fp16(backend, tmp_path):
    m = kit_models.mlp(tmp_path, batch=2, seed=7)
    rng = np.random.default_rng(3)
    calib = CalibrationSet([{"x": rng.standard_normal((2, 16)).astype(np.float32)} for _ in range(8)])
    with pytest.raises(InputError, match="hybrid layer.*not found.*nope"):
        backend.quantize(m.path, "w8a8", calib, tmp_path / "bad.rknn", hybrid_fp16_layers=["nope"])
    art = backend.quantize(m.path, "w8a8", calib, tmp_path / "h.rknn", hybrid_fp16_layers=["y"])
    data = stamp.read(art)
    assert data["hybrid_fp16"] == ["y"]
    with backend.load(art) as s:
        got = s.run(m.feeds)["y"]
    np.testing.assert_allclose(got, m.reference(m.feeds)["y"], rtol=0.1, atol=0.1)


# --- board path: stand-in file trees and recorded runtime output ---------------------------------
def _fake_board_root_standin(tmp_path: Path, governor: str = "dmc_ondemand") -> Path:
    root = tmp_path / "fake_board_root_standin"
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/compatible").write_bytes(b"radxa,rock-5b\x00rockchip,rk3588\x00")
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/librknnrt.so").write_bytes(b"\x7fELF....librknnrt version: 2.3.0 "
                                                b"(c949ad889d@2024-11-07T11:35:33)\x00")
    (root / "sys/kernel/debug/rknpu").mkdir(parents=True)
    (root / "sys/kernel/debug/rknpu/version").write_text("RKNPU driver: v0.9.8\n")
    (root / "sys/class/devfreq/dmc").mkdir(parents=True)
    (root / "sys/class/devfreq/dmc/governor").write_text(governor + "\n")
    return root


def test_board_detection_on_standin_tree(tmp_path):
    root = _fake_board_root_standin(tmp_path)
    assert hw.soc(root) == "rk3588"
    assert hw.is_board(root)
    assert hw.runtime_version(hw.runtime_library(root)).startswith("2.3.0")
    assert hw.driver_version(root) == "0.9.8"
    assert not hw.is_board(tmp_path / "empty")
    assert hw.is_board(Path("/")) is False  # this development machine is no board


def test_board_probe_warns_on_unpinned_ddr_governor(backend, tmp_path):
    p = backend._probe_board(_fake_board_root_standin(tmp_path, "dmc_ondemand"))
    assert p.details["mode"] == "board" and p.details["soc"] == "rk3588"
    assert p.versions["librknnrt"].startswith("2.3.0") and p.versions["npu-driver"] == "0.9.8"
    assert any("governor is 'dmc_ondemand'" in w["message"] for w in p.details["warnings"])
    assert not p.available and any("rknn-toolkit-lite2" in pr.message for pr in p.problems)
    pinned = backend._probe_board(_fake_board_root_standin(tmp_path / "b", "performance"))
    assert pinned.details["warnings"] == []


def test_core_masks():
    assert hw.core_mask("auto") == 0 and hw.core_mask("0_1_2") == 7 and hw.core_mask(2) == 4
    with pytest.raises(InputError, match="use one of"):
        hw.core_mask("3")


RECORDED_EVAL_PERF_OUTPUT_STANDIN = """\
ID   OpType           DataType Target InputShape                               OutputShape            Cycles(DDR/NPU/Total)    Time(us)     MacUsage(%)          WorkLoad(0/1/2)      RW(KB)       FullName
1    InputOperator    INT8     CPU    \\                                        (1,3,640,640)          0/0/0                    6            \\                    0.0%/0.0%/0.0%       0            InputOperator:images
2    ConvExSwish      INT8     NPU    (1,3,640,640),(16,3,3,3),(16)            (1,16,320,320)         380087/1228800/1228800   1271         1.51/0.00/0.00       100.0%/0.0%/0.0%     1206         Conv:/model.0/conv/Conv
3    Concat           INT8     NPU    (1,16,160,160),(1,16,160,160)            (1,32,160,160)         109532/0/109532          190          \\                    100.0%/0.0%/0.0%     800          Concat:/model.2/Concat
Total Operator Elapsed Per Frame Time(us): 1467
"""
RECORDED_EVAL_MEMORY_OUTPUT_STANDIN = """\
NPU model memory detail(bytes):
    Weight Memory: 8.67 MiB
    Internal Tensor Memory: 7.42 MiB
    Other Memory: 3.03 MiB
    Total Memory: 19.12 MiB
"""


def test_perf_and_memory_parsers_on_recorded_output():
    rows = session.parse_perf_table(RECORDED_EVAL_PERF_OUTPUT_STANDIN)
    assert [r[0] for r in rows] == ["Conv:/model.0/conv/Conv", "Concat:/model.2/Concat", "InputOperator:images"]
    assert rows[0][1] == "ConvExSwish" and rows[0][2] == pytest.approx(1.271) and rows[0][3] == "NPU"
    assert session.parse_memory(RECORDED_EVAL_MEMORY_OUTPUT_STANDIN) == int(19.12 * (1 << 20))


def test_log_parsers():
    log = "\x1b[1;33mW\x1b[0m build: Show op fuse match nodes:\nRule: remove_top_reshape\n" \
          "W You can add disable_rules=['remove_top_reshape'] in rknn.config() to temporarily disable\n" \
          "E build: Traceback (most recent call last):\n  File \"x\", line 1\nKeyError: 'k_mm'\n"
    assert tk.failing_rule(log) == "remove_top_reshape"
    assert tk.first_error(log) == "KeyError: 'k_mm'"
    assert tk.first_error("E config: The quantized_dtype = 'w4a16' not support in 'rk3588'!\n") == \
        "config: The quantized_dtype = 'w4a16' not support in 'rk3588'!"
    assert tk.failing_rule("E build: something else\n") is None


def test_dynamic_input_shape_sets(backend, tmp_path):
    m = kit_models.mlp(tmp_path, batch="batch", seed=11)
    art = backend.quantize(m.path, None, None, tmp_path / "d.rknn", dynamic_input=[[[1, 16]], [[3, 16]]])
    assert stamp.read(art)["dynamic_input"] == [[[1, 16]], [[3, 16]]]
    with backend.load(art) as s:
        assert s.inputs[0].shape == (None, 16)
        for n in (1, 3):
            x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
            np.testing.assert_allclose(s.run({"x": x})["y"], m.reference({"x": x})["y"], rtol=2e-2, atol=2e-2)
        with pytest.raises(FeedError, match=r"x \[2, 16\] are not among the model's dynamic_input"):
            s.run({"x": np.zeros((2, 16), np.float32)})


def _copy_artifact(art: Path, dst: Path, with_source: bool) -> Path:
    """The artifact and its companions (stamp, log, build inputs, and its source ONNX if ``with_source``) in ``dst``:
    a path the simulator has not built in this process, so loading it rebuilds."""
    dst.mkdir()
    files = [art, stamp.stamp_path(art), tk.log_path(art), tk.sidecar(art)]
    for f in files + ([tk.source_model(art)] if with_source else []):
        shutil.copy(f, dst / f.name)
    return dst / art.name


def test_the_source_onnx_sits_beside_the_artifact_not_in_its_tar(backend, kit, attention_art, tmp_path):
    """One file per source, so that a bucketed bundle's artifacts (one ONNX, a shape each in the recipe) hold it once
    (edgeinfer.files.link_duplicates); the simulator rebuilds from it, and from a tar of before, which held it."""
    a = kit["attention"]
    assert tk.source_model(attention_art).read_bytes() == a.path.read_bytes()
    with tarfile.open(tk.sidecar(attention_art)) as tf:
        assert "model.onnx" not in tf.getnames() and "recipe.json" in tf.getnames()
    with backend.load(attention_art) as s:
        want = s.run(a.feeds)["y"]

    lonely = _copy_artifact(attention_art, tmp_path / "lonely", with_source=False)
    with pytest.raises(InputError, match=r"cannot rebuild attention.rknn: its source model attention.rknn.src.onnx"):
        backend.load(lonely)

    moved = _copy_artifact(attention_art, tmp_path / "moved", with_source=True)
    with backend.load(moved) as s:
        np.testing.assert_allclose(s.run(a.feeds)["y"], want, rtol=1e-3, atol=1e-3)

    old = _copy_artifact(attention_art, tmp_path / "old", with_source=False)  # the layout of before: all in the tar
    with tarfile.open(tk.sidecar(attention_art)) as src, tarfile.open(tk.sidecar(old), "w") as tf:
        for m in src.getmembers():
            tf.addfile(m, src.extractfile(m))
        tf.add(a.path, arcname="model.onnx")
    with backend.load(old) as s:
        np.testing.assert_allclose(s.run(a.feeds)["y"], want, rtol=1e-3, atol=1e-3)
