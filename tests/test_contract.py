"""The backend contract's value types and the core's validation (no backend needed)."""

import numpy as np
import pytest

from edgeinfer.contract.backend import Backend, CalibrationSet, TensorSpec, latency_stats, validate_feeds
from edgeinfer.contract.registry import contract_problem
from edgeinfer.errors import FeedError

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
