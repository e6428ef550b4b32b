"""The backend contract's value types and the core's validation (no backend needed)."""

import numpy as np
import pytest

from edgeinfer.contract.backend import Backend, CalibrationSet, TensorSpec, latency_stats, validate_feeds
from edgeinfer.contract.records import Tensors
from edgeinfer.contract.registry import contract_problem
from edgeinfer.errors import FeedError, InputError

SPECS = [TensorSpec("ids", ("batch", "seq"), "int64"), TensorSpec("mask", ("batch", "seq"), "int64")]


def test_valid_feeds_pass_through_as_contiguous_arrays():
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::1]
    out = validate_feeds(SPECS, {"ids": ids, "mask": np.ones((3, 4), np.int64)})
    assert out["ids"].flags.c_contiguous and out["ids"].shape == (3, 4)


def test_symbolic_dimension_must_agree_across_inputs():
    with pytest.raises(FeedError, match="'seq' is 5 but input 'ids' has it as 4"):
        validate_feeds(SPECS, {"ids": np.zeros((3, 4), np.int64), "mask": np.zeros((3, 5), np.int64)})


def test_rank_mismatch_names_tensor_expected_and_got():
    with pytest.raises(FeedError, match=r"'ids': expected shape \[batch, seq\], got \[4\]"):
        validate_feeds(SPECS, {"ids": np.zeros(4, np.int64), "mask": np.zeros((1, 4), np.int64)})


def test_static_dimension_mismatch():
    with pytest.raises(FeedError, match=r"expected shape \[1, 128\], got \[1, 64\]"):
        validate_feeds([TensorSpec("x", (1, 128), "float32")], {"x": np.zeros((1, 64), np.float32)})


def test_unknown_dimension_accepts_any_size():
    out = validate_feeds([TensorSpec("x", (None, 2), "float32")], {"x": np.zeros((7, 2), np.float32)})
    assert out["x"].shape == (7, 2)


def test_latency_stats_are_nearest_rank_percentiles():
    stats = latency_stats([float(x) for x in range(10, 0, -1)])  # 1..10, unsorted
    assert stats == {"mean": 5.5, "p50": 5.0, "p90": 9.0, "p99": 10.0, "min": 1.0, "max": 10.0}


def test_calibration_set_from_list_and_from_callable():
    samples = [{"x": np.full((1, 2), i, np.float32)} for i in range(3)]
    a = CalibrationSet(samples)
    b = CalibrationSet(lambda: iter(samples), length=3)
    assert len(a) == len(b) == 3
    assert [s["x"][0, 0] for s in a] == [s["x"][0, 0] for s in b] == [0, 1, 2]
    assert [s["x"][0, 0] for s in a] == [0, 1, 2]  # iterable more than once
    with pytest.raises(ValueError):
        CalibrationSet(lambda: iter(samples))


def test_calibration_check_names_the_bad_sample():
    cal = CalibrationSet([{"x": np.zeros((1, 2), np.float32)}, {"y": np.zeros((1, 2), np.float32)}])
    with pytest.raises(FeedError, match="calibration sample 1: unknown input 'y'"):
        cal.check([TensorSpec("x", (1, 2), "float32")])


def test_contract_problem_names_the_missing_method():
    class NoOpen(Backend):
        name = "no-open"

        def probe(self):
            raise NotImplementedError

        def convert(self, model, scheme, calibration, out, **options):
            raise NotImplementedError

    assert contract_problem(NoOpen) == (
        "backend 'no-open' does not implement required method `open` (or `open_decoder` for a decoder-only backend)"
    )
    assert "not a subclass" in contract_problem(object)

    class Nameless(NoOpen):
        name = ""

    assert "does not set `name`" in contract_problem(Nameless)

    class FlatTuple(NoOpen):
        name = "flat"
        tensors = (".onnx",)

    assert contract_problem(FlatTuple) == ("backend 'flat': `tensors` must be a Tensors(...) record "
                                           "(edgeinfer.contract), not ('.onnx',)")


def test_open_gets_the_stamp_load_checked_and_nothing_else_reads_it(tmp_path):
    from edgeinfer.contract import Session, Tensors, stamp

    seen = []

    class Stamped(Backend):
        name = "stamped"
        tensors = Tensors(native=(".x",))

        def convert(self, model, scheme, calibration, out, **options):
            out.write_bytes(b"x")
            return {"target": "cpu", "inputs": [TensorSpec("x", (1,), "float32")], "extra": 7}

        def open(self, artifact, device, stamp, **options):
            seen.append(dict(stamp))
            return Session([TensorSpec("x", (1,), "float32")], [])

    model = tmp_path / "m.onnx"
    model.write_bytes(b"m")
    art = Stamped().quantize(model, None, None, tmp_path / "m.x")
    Stamped().load(art)
    assert seen[0] == stamp.read(art) and seen[0]["extra"] == 7 and seen[0]["scheme"] == "fp32"
    unstamped = tmp_path / "u.x"
    unstamped.write_bytes(b"u")
    Stamped().load(unstamped)
    assert seen[1] == {}
    p = stamp.stamp_path(art)
    p.write_text(p.read_text().replace('"versions": {', '"versions": {"toolkit": "x 1.0", ', 1))
    Stamped().load(art)  # the backend names no toolkit: nothing to compare

    class Released(Stamped):
        def versions(self):
            return {"toolkit": "x 2.0"}

    with pytest.raises(InputError, match=r"^m.x was built with x 1.0 but x 2.0 is installed; "
                                         r"convert the model again \(or install x 1.0\)$"):
        Released().load(art)  # the default: any other release is refused, older or newer


def test_optional_facts_answer_named_records():
    from edgeinfer.contract import Placement

    class Plain(Backend):
        name = "plain"

    assert Plain().paging_limit(None) is None
    assert Plain().placement("3") == Placement() and Plain().placement("GPU.1") == Placement(device="GPU.1")
    assert Plain().placement("GPU.1").env == {} and Plain().placement("GPU.1").options == {}


def test_decoder_protocols_are_separate_and_their_primitives_required():
    from edgeinfer.contract import BatchingDecoder, NativeDecoder, StepDecoder

    facts = {"context": 8, "vocab_size": 4, "kv_cache_bytes": 0}

    class HalfSteps(StepDecoder):
        def prefill(self, slot, token_ids):
            return np.zeros(4, np.float32)

    with pytest.raises(TypeError, match="decode"):
        HalfSteps(**facts)

    class Loop(NativeDecoder):
        def generate_native(self, prompt_ids, options, on_token):
            return {}

    loop = Loop(**facts)
    assert not isinstance(loop, StepDecoder) and not isinstance(loop, BatchingDecoder)
    with pytest.raises(TypeError, match="add_request"):
        type("NoBatching", (BatchingDecoder, Loop), {})(**facts)


def test_a_step_decoder_without_prefill_batch_prefills_each_slot_in_turn():
    """The contract's default ``prefill_batch``: one ``prefill`` per (slot, chunk), in order, rows stacked."""
    from edgeinfer.contract import StepDecoder

    class Counting(StepDecoder):
        def __init__(self):
            super().__init__(context=8, vocab_size=3, kv_cache_bytes=0, slots=3)
            self.calls = []

        def prefill(self, slot, token_ids):
            self.calls.append((slot, list(token_ids)))
            return np.array([slot, len(token_ids), token_ids[-1]], np.float32)

        def decode(self, slots, token_ids):
            raise AssertionError("not called")

        def reset(self, slot):
            pass

    d = Counting()
    got = d.prefill_batch([2, 0], [np.array([5, 6, 7]), np.array([9])])
    assert d.calls == [(2, [5, 6, 7]), (0, [9])]
    np.testing.assert_array_equal(got, [[2, 3, 7], [0, 1, 9]])
    assert got.dtype == np.float32


# --- the chores the core does once for every plugin (edgeinfer.contract.helpers, onnx_io) ------------------


def test_first_line_skips_blank_and_unwanted_lines_and_cuts():
    from edgeinfer.contract.helpers import first_line

    assert first_line(ValueError("\n  \n  bad header  \nTraceback follows")) == "bad header"
    assert first_line(KeyError()) == "KeyError"  # no message: the exception's type
    skip = first_line(RuntimeError("Exception from src/x.cpp:1:\nCheck 'a'\nshape mismatch"), 240,
                      skip=lambda ln: ln.startswith(("Exception from", "Check")))
    assert skip == "shape mismatch"
    assert first_line(RuntimeError("x" * 300), 20) == "x" * 17 + "..."


def test_check_options_names_the_bad_key_and_what_is_accepted():
    from edgeinfer.contract.helpers import check_options
    from edgeinfer.errors import InputError

    check_options({"threads": 2}, ("threads",), "backend 'b'")
    with pytest.raises(InputError) as e:
        check_options({"threads": 1, "zz": 1, "aa": 2}, ("threads", "hint"), "backend 'b'")
    assert e.value.one_line() == "unknown option 'aa' for backend 'b'; known: threads, hint"
    with pytest.raises(InputError) as e:
        check_options({"aa": 1}, (), "backend 'b' convert")
    assert e.value.one_line() == "unknown option 'aa' for backend 'b' convert; it takes no options"


def test_core_refuses_unknown_options_before_the_backend_sees_them(tmp_path):
    from edgeinfer.errors import InputError

    class Refusing(Backend):
        name = "refusing"
        tensors = Tensors(native=(".x",), convert_options=("target",))

        def convert(self, *a, **k):
            raise AssertionError("convert must not be called")

        def open(self, *a, **k):
            raise AssertionError("open must not be called")

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    with pytest.raises(InputError, match="unknown option 'bogus' for backend 'refusing' convert; known: target"):
        Refusing().quantize(model, "fp32", None, tmp_path / "m.x", bogus=1)
    with pytest.raises(InputError, match="unknown option 'threads' for backend 'refusing'; it takes no options"):
        Refusing().load(model, threads=1)


def test_check_device_accepts_listed_names_in_any_case():
    from edgeinfer.contract.helpers import check_device
    from edgeinfer.errors import InputError

    for ok in (None, "", "CPU", "cpu", "Auto"):
        check_device(ok, ("cpu", "auto"), "b")
    with pytest.raises(InputError) as e:
        check_device("npu", ("cpu", "auto"), "b")
    assert e.value.one_line() == "unknown device 'npu' for backend 'b'; use one of: cpu, auto (or omit --device)"


def test_package_version_and_missing():
    from importlib.metadata import version

    from edgeinfer.contract.helpers import package_version

    assert package_version("numpy") == version("numpy") == np.__version__
    assert package_version("no-such-distribution-xyz") is None
    assert package_version("no-such-distribution-xyz", "missing") == "missing"


def test_onnx_io_leaves_initializers_out_and_keeps_symbolic_dims():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from edgeinfer.contract.onnx_io import onnx_io

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", None])],
        [numpy_helper.from_array(np.zeros(4, np.float16), "w")])
    inputs, outputs = onnx_io(helper.make_model(graph))
    assert inputs == [TensorSpec("x", ("batch", 4), "float16")]
    assert outputs == [TensorSpec("y", ("batch", None), "float16")]


def test_profile_sorts_op_times_and_reports_load_time(tmp_path):
    from edgeinfer.contract.backend import OpTime, Session

    class Unsorted(Session):
        def infer(self, feeds):
            return {"y": feeds["x"]}

        def op_times(self, feeds):
            return [OpTime("a", "Add", 1.0), OpTime("b", "MatMul", 3.0), OpTime("c", "Relu", 2.0)]

    class Opens(Backend):
        name = "opens"
        tensors = Tensors(native=(".x",))

        def open(self, artifact, device, stamp, **options):
            return Unsorted([TensorSpec("x", (1,), "float32")], [TensorSpec("y", (1,), "float32")])

    art = tmp_path / "m.x"
    art.write_bytes(b"")
    s = Opens().load(art)
    prof = s.profile({"x": np.ones(1, np.float32)}, repeat=1, top=2)
    assert [o.name for o in prof.ops] == ["b", "c"]
    assert s.load_ms is not None and s.load_ms >= 0 and prof.notes["load_ms"] == s.load_ms


def test_refuses_newer_compares_releases_as_numbers():
    from edgeinfer.contract.stamp import refuses_newer

    assert refuses_newer("onnxruntime 1.9.0", "onnxruntime 1.10.0") is None  # 9 < 10, though "9" > "1" as text
    assert refuses_newer("onnxruntime 1.26.0", "onnxruntime 1.26.0+cpu") is None
    assert refuses_newer("onnxruntime 1.10.0", "onnxruntime 1.9.0") == (
        "was built with onnxruntime 1.10.0, newer than the installed onnxruntime 1.9.0; upgrade to onnxruntime "
        "1.10.0 or later, or convert the model again here")
    assert refuses_newer("onnxruntime 1.26.0", "onnxruntime missing") == (
        "was built with onnxruntime 1.26.0, and this installation has onnxruntime missing; install onnxruntime "
        "1.26.0 or later")
