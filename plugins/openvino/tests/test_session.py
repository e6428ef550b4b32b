"""Sessions and conversions on the kit's small models with real OpenVINO on this machine's CPU:
cache, hints, precision, run_many, device fallback, perf counters, static shapes, quantization schemes."""

import json
import warnings
from pathlib import Path

import numpy as np
import openvino as ov
import pytest
from edgeinfer_openvino.convert import int4_group_size, weight_count
from edgeinfer_openvino.device import npu_details
from edgeinfer_openvino.session import DeviceFallbackWarning

import edgeinfer
from edgeinfer.contract import CalibrationSet, stamp
from edgeinfer.errors import BackendUnavailableError, EdgeInferError, FeedError, InputError, ModelError
from edgeinfer.testing import models

HAS_NPU = "NPU" in ov.Core().available_devices


@pytest.fixture(scope="module")
def backend():
    return edgeinfer.backend("openvino")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    root = tmp_path_factory.mktemp("kit")
    return {m.name: m for m in models.all_models(root)}


@pytest.fixture(scope="module")
def ir(backend, kit, tmp_path_factory):
    """fp32 IRs of the kit models, converted once."""
    root = tmp_path_factory.mktemp("ir")
    return {name: backend.quantize(m.path, "fp32", None, root / f"{name}.xml") for name, m in kit.items()}


def wide_mlp(path: Path, width: int = 256, layers: int = 3, seed: int = 7):
    """x[batch, width] → `layers` MatMul+Relu; wide enough for INT4 groups of 128."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(layers)]
    nodes, prev = [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"],
                                                                                           [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(ws)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))

    def ref(x):
        for w in ws:
            x = np.maximum(x @ w, 0)
        return x

    return path, ref


def constant_types(xml: Path) -> set[str]:
    m = ov.Core().read_model(str(xml))
    return {op.get_output_element_type(0).get_type_name() for op in m.get_ops() if op.get_type_name() == "Constant"}


def op_types(xml: Path) -> set[str]:
    return {op.get_type_name() for op in ov.Core().read_model(str(xml)).get_ops()}


# --- probe ---------------------------------------------------------------------------------------


def test_probe_reports_the_real_core(backend):
    p = backend.probe()
    core = ov.Core()
    assert p.available
    assert p.devices == list(core.available_devices)
    assert p.versions["openvino"] == ov.__version__
    assert p.details["devices"]["CPU"]["name"] == core.get_property("CPU", "FULL_DEVICE_NAME")
    assert ("npu" in p.details) == HAS_NPU
    json.dumps(p.to_json())


def test_npu_details_from_a_recorded_property_standin():
    recorded_npu_properties_standin = {
        "FULL_DEVICE_NAME": "Intel(R) AI Boost",
        "DEVICE_ARCHITECTURE": "3720",
        "NPU_DRIVER_VERSION": 1688,
    }

    def get_property(name):
        return recorded_npu_properties_standin[name]  # KeyError for what this driver does not report

    assert npu_details(get_property) == {"name": "Intel(R) AI Boost", "architecture": "3720", "driver_version": 1688}


def test_versions_name_the_toolkit(backend):
    v = backend.versions()
    assert v["toolkit"].startswith("openvino ") and v["toolkit"].split()[1] in ov.__version__


# --- open: cache, hints, precision, fallback -----------------------------------------------------


def test_cache_dir_miss_then_hit_with_identical_outputs(backend, ir, kit, tmp_path):
    feeds = kit["attention"].feeds
    with backend.load(ir["attention"], device="CPU", cache_dir=tmp_path / "cache") as first:
        out1 = first.run(feeds)["y"]
        n1 = first.profile_notes()
    blobs = list((tmp_path / "cache").iterdir())
    assert blobs, "the first compile writes the cache"
    with backend.load(ir["attention"], device="CPU", cache_dir=tmp_path / "cache") as second:
        out2 = second.run(feeds)["y"]
        n2 = second.profile_notes()
    assert (n1["cache"], n2["cache"]) == ("miss", "hit")
    assert n1["compile_ms"] > 0 and n2["compile_ms"] > 0
    np.testing.assert_array_equal(out1, out2)
    with backend.load(ir["attention"], device="CPU") as plain:
        assert plain.profile_notes()["cache"] == "off"


@pytest.mark.parametrize("hint", ["LATENCY", "THROUGHPUT", "throughput"])
def test_performance_hint_reaches_the_compiled_model(backend, ir, hint):
    with backend.load(ir["mlp"], device="CPU", hint=hint) as s:
        assert str(s._compiled.get_property("PERFORMANCE_HINT")) == hint.upper()
        assert s.profile_notes()["performance_hint"] == hint.upper()
        assert s.optimal_requests >= 1


def test_bad_hint_and_unknown_option_are_input_errors(backend, ir):
    with pytest.raises(InputError, match="BURST"):
        backend.load(ir["mlp"], device="CPU", hint="burst")
    with pytest.raises(InputError, match="turbo"):
        backend.load(ir["mlp"], device="CPU", turbo=True)
    with pytest.raises(InputError, match="f8"):
        backend.load(ir["mlp"], device="CPU", precision="f8")


def test_fp32_artifacts_compute_in_f32_on_cpu_unless_told_otherwise(backend, ir):
    with backend.load(ir["mlp"], device="CPU") as s:
        assert s.profile_notes()["inference_precision"] == "f32"
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" in caps:
        with backend.load(ir["mlp"], device="CPU", precision="bf16") as s:
            assert s.profile_notes()["inference_precision"] == "bf16"


@pytest.mark.skipif(HAS_NPU, reason="this machine has an NPU: nothing falls back")
def test_requested_npu_that_falls_back_to_cpu_warns(backend, ir, kit):
    with pytest.warns(DeviceFallbackWarning, match="asked for NPU .* executes the model on CPU"):
        s = backend.load(ir["mlp"], device="AUTO:NPU,CPU")
    with s:
        assert s.device == "CPU"
        assert s.execution_devices == ["CPU"]
        assert "NPU" in s.profile_notes()["fallback"]
        np.testing.assert_allclose(s.run(kit["mlp"].feeds)["y"], kit["mlp"].reference(kit["mlp"].feeds)["y"],
                                   rtol=1e-4, atol=1e-4)


def test_no_warning_when_the_device_runs_what_was_asked(backend, ir):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceFallbackWarning)
        with backend.load(ir["mlp"], device="CPU") as s:
            assert s.profile_notes()["fallback"] is None


def test_unknown_and_absent_devices(backend, ir):
    with pytest.raises(InputError, match="'FOO'"):
        backend.load(ir["mlp"], device="FOO")
    if not HAS_NPU:
        with pytest.raises(BackendUnavailableError, match="NPU"):
            backend.load(ir["mlp"], device="NPU")


# --- run / run_many / profile --------------------------------------------------------------------


def test_run_many_matches_reference_in_order(backend, ir, kit):
    m = kit["mlp_dynamic"]
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((n, 16)).astype(np.float32)} for n in (1, 3, 2, 5, 4, 1, 2)]
    with backend.load(ir["mlp_dynamic"], device="CPU", hint="THROUGHPUT") as s:
        for jobs in (None, 3):
            outs = s.run_many(feeds, jobs=jobs)
            assert len(outs) == len(feeds)
            for f, o in zip(feeds, outs):
                np.testing.assert_allclose(o["y"], m.reference(f)["y"], rtol=1e-4, atol=1e-4)
        assert s.run_many([]) == []
        with pytest.raises(FeedError, match="'bogus'"):
            s.run_many([feeds[0], {"bogus": feeds[0]["x"]}])
    with pytest.raises(InputError, match="closed"):
        s.run_many(feeds)


def test_dynamic_dims_keep_their_onnx_names(backend, ir):
    with backend.load(ir["mlp_dynamic"], device="CPU") as s:
        assert s.inputs[0].shape == ("batch", 16)


def test_profile_has_op_times_with_exec_types_and_notes(backend, ir, kit):
    with backend.load(ir["attention"], device="CPU") as s:
        prof = s.profile(kit["attention"].feeds, repeat=3, top=5)
    assert 0 < len(prof.ops) <= 5
    assert all(o.exec_type for o in prof.ops), [o.exec_type for o in prof.ops]
    assert any(o.op_type in ("MatMul", "FullyConnected", "Softmax") for o in prof.ops)
    notes = prof.notes
    assert notes["compile_ms"] > 0 and notes["first_inference_ms"] > 0
    assert notes["execution_devices"] == ["CPU"] and notes["requested_device"] == "CPU"
    json.dumps(prof.to_json())


# --- corrupt artifacts ---------------------------------------------------------------------------


def test_corrupt_ir_is_a_one_line_model_error(backend, tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<net>this is not an IR")
    bad.with_suffix(".bin").write_bytes(b"\0" * 16)
    for opts in ({}, {"cache_dir": tmp_path / "c"}):
        with pytest.raises(ModelError, match="bad.xml is not a readable OpenVINO IR") as err:
            backend.load(bad, device="CPU", **opts)
        assert "\n" not in err.value.one_line() and err.value.exit_code == 2


def test_xml_that_is_not_an_ir_names_its_root(backend, tmp_path):
    other = tmp_path / "notes.xml"
    other.write_text("<?xml version='1.0'?><notes><note>hi</note></notes>")
    other.with_suffix(".bin").write_bytes(b"")
    with pytest.raises(ModelError, match="root element is <notes>, not <net>"):
        backend.load(other, device="CPU")


def test_ir_without_its_bin_says_so(backend, ir, tmp_path):
    lone = tmp_path / "lone.xml"
    lone.write_bytes(ir["mlp"].read_bytes())
    with pytest.raises(ModelError, match="lone.bin is missing"):
        backend.load(lone, device="CPU")


# --- convert: static shapes, NPU target ------------------------------------------------------------


def test_shapes_option_makes_the_ir_static(backend, kit, tmp_path):
    m = kit["mlp_dynamic"]
    out = backend.quantize(m.path, "fp32", None, tmp_path / "static.xml", shapes={"x": [4, 16]})
    data = stamp.read(out)
    assert data["target"] == "any" and data["inputs"][0]["shape"] == [4, 16] and data["shapes"] == {"x": [4, 16]}
    with backend.load(out, device="CPU") as s:
        assert s.inputs[0].shape == (4, 16)
        x = np.ones((4, 16), np.float32)
        np.testing.assert_allclose(s.run({"x": x})["y"], m.reference({"x": x})["y"], rtol=1e-4, atol=1e-4)
        with pytest.raises(FeedError, match=r"\[4, 16\]"):
            s.run({"x": np.ones((3, 16), np.float32)})


def test_npu_target_needs_static_shapes(backend, kit, tmp_path):
    m = kit["mlp_dynamic"]
    with pytest.raises(InputError, match="NPU needs static input shapes.*shapes="):
        backend.quantize(m.path, "fp16", None, tmp_path / "npu.xml", target="npu")
    assert not (tmp_path / "npu.xml").exists() and not (tmp_path / "npu.bin").exists()
    out = backend.quantize(m.path, "fp16", None, tmp_path / "npu.xml", target="npu", shapes={"x": [1, 16]})
    assert stamp.read(out)["target"] == "npu"


def test_dynamic_ir_is_refused_for_the_npu(backend, ir):
    assert stamp.read(ir["mlp_dynamic"])["target"] == "dynamic"
    with pytest.raises(InputError, match="dynamic input shapes.*NPU"):
        backend.load(ir["mlp_dynamic"], device="NPU")


def test_bad_shapes_option(backend, kit, tmp_path):
    with pytest.raises(InputError, match="unknown input 'y'"):
        backend.quantize(kit["mlp"].path, "fp32", None, tmp_path / "a.xml", shapes={"y": [1, 16]})
    with pytest.raises(InputError, match="positive integers"):
        backend.quantize(kit["mlp"].path, "fp32", None, tmp_path / "b.xml", shapes={"x": [-1, 16]})
    with pytest.raises(InputError, match="unknown option"):
        backend.quantize(kit["mlp"].path, "fp32", None, tmp_path / "c.xml", sharpness=3)


# --- convert: schemes ----------------------------------------------------------------------------


def test_fp16_ir_stores_fp16_weights_and_keeps_fp32_io(backend, kit, tmp_path):
    m = kit["attention"]
    out = backend.quantize(m.path, "fp16", None, tmp_path / "att16.xml")
    assert "f16" in constant_types(out)
    with backend.load(out, device="CPU") as s:
        assert s.inputs[0].dtype == "float32" and s.outputs[0].dtype == "float32"
        np.testing.assert_allclose(s.run(m.feeds)["y"], m.reference(m.feeds)["y"], rtol=1e-2, atol=1e-2)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return wide_mlp(tmp_path_factory.mktemp("wide") / "wide.onnx")


def test_weight_count_and_int4_group_size(wide):
    model = ov.Core().read_model(str(wide[0]))
    assert weight_count(model) == 3 * 256 * 256
    assert int4_group_size(weight_count(model)) == 128
    assert int4_group_size(1_500_000_000) == -1  # channel-wise above 1B parameters (NPU guidance)
    assert int4_group_size(1_500_000_000, requested=64) == 64


@pytest.mark.parametrize("scheme,stored", [("w8a16", "u8"), ("w4a16", "i4")])
def test_weight_only_compression(backend, wide, tmp_path, scheme, stored):
    path, ref = wide
    out = backend.quantize(path, scheme, None, tmp_path / f"{scheme}.xml")
    data = stamp.read(out)
    assert data["scheme"] == scheme and data["weights"] == 3 * 256 * 256
    assert stored in constant_types(out)
    if scheme == "w4a16":
        assert data["group_size"] == 128 and "int4_sym" in data["method"]
        assert out.with_suffix(".bin").stat().st_size < 3 * 256 * 256  # well under one byte per weight
    x = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    with backend.load(out, device="CPU") as s:
        got = s.run({"x": x})["y"]
    want = ref(x)
    cos = (got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want))
    assert cos > (0.999 if scheme == "w8a16" else 0.98)


def test_grouped_w4a16_scheme_names_set_the_group(backend, wide, tmp_path):
    out = backend.quantize(wide[0], "w4a16_g64", None, tmp_path / "g64.xml")
    data = stamp.read(out)
    assert data["scheme"] == "w4a16_g64" and data["group_size"] == 64
    assert "i4" in constant_types(out)
    with pytest.raises(InputError, match="fixes the group size"):
        backend.quantize(wide[0], "w4a16_g64", None, tmp_path / "g.xml", group_size=128)


def test_w8a8_is_calibrated_post_training_quantization(backend, wide, tmp_path):
    path, ref = wide
    rng = np.random.default_rng(2)
    calib = CalibrationSet([{"x": rng.standard_normal((1, 256)).astype(np.float32)} for _ in range(30)])
    out = backend.quantize(path, "int8", calib, tmp_path / "w8a8.xml")
    data = stamp.read(out)
    assert data["scheme"] == "w8a8" and data["calibration_samples"] == 30 and data["model_type"] == "none"
    assert "FakeQuantize" in op_types(out)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    with backend.load(out, device="CPU") as s:
        got = s.run({"x": x})["y"]
    want = ref(x)
    assert (got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)) > 0.99


def test_w8a8_without_calibration_says_what_to_do(backend, wide, tmp_path):
    with pytest.raises(InputError, match="calibration set.*w8a16"):
        backend.quantize(wide[0], "w8a8", None, tmp_path / "nocal.xml")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
def test_calibration_with_wrong_input_names_is_one_line_and_leaves_nothing(backend, wide, tmp_path, scheme):
    calib = CalibrationSet([{"input": np.zeros((1, 256), np.float32)}])
    with pytest.raises(FeedError, match="calibration sample 0: unknown input 'input'.*inputs are: x") as err:
        backend.quantize(wide[0], scheme, calib, tmp_path / "bad.xml")
    assert "\n" not in err.value.one_line() and err.value.exit_code == 2
    assert not list(tmp_path.iterdir())


def test_corrupt_onnx_convert_is_one_line(backend, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 definitely not a protobuf")
    with pytest.raises(EdgeInferError, match="bad.onnx is not a readable model") as err:
        backend.quantize(bad, "fp16", None, tmp_path / "out.xml")
    assert "\n" not in err.value.one_line() and err.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]
