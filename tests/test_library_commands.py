"""The library functions the thin CLI commands call: run_once (``edgeinfer run``) and plan_models
(``edgeinfer plan``), used directly from Python."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.errors import InputError
from edgeinfer.planning.chain import ChainPlan
from edgeinfer.planning.details import RefusedCell
from edgeinfer.planning.matrix import PlanMatrix, plan_models
from edgeinfer.planning.planner import Plan
from edgeinfer.run.once import Paging, run_once
from edgeinfer.testing import models


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return models.mlp(tmp_path_factory.mktemp("m"), batch=2)


def test_run_once_reports_and_writes_the_reference_outputs(mlp, tmp_path):
    np.save(tmp_path / "x.npy", mlp.feeds["x"])
    report = run_once(mlp.path, inputs=[f"x={tmp_path / 'x.npy'}"], backend="onnxruntime", out_dir=tmp_path / "o")
    assert report["outputs"] == [{"name": "y", "shape": [2, 8], "dtype": "float32", "non_finite": 0}]
    assert report["written"] == [str(tmp_path / "o" / "y.npy")] and "paging" not in report
    np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), mlp.reference(mlp.feeds)["y"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("paging, needle", [
    (Paging(window=0), "--paging must be at least 1, got 0"),
    (Paging(segments=2), "--segments/--cut go with --paging W"),
    (Paging(cuts=("/relu",)), "--segments/--cut go with --paging W"),
])
def test_run_once_refuses_paging_options_that_do_not_go_together(mlp, tmp_path, paging, needle):
    np.save(tmp_path / "x.npy", mlp.feeds["x"])
    with pytest.raises(InputError, match=needle):
        run_once(mlp.path, inputs=[f"x={tmp_path / 'x.npy'}"], paging=paging)


def test_run_once_text_needs_a_bundle(mlp):
    with pytest.raises(InputError, match="--text needs a bundle"):
        run_once(mlp.path, texts=["hello"])


def test_one_model_on_one_board_is_a_plan_with_suggestions():
    p = plan_models(["qwen3-8b"], "rk3588-8g", quant="w8a8")
    assert isinstance(p, Plan) and not p.fits
    assert p.suggestions.board == "rk3588-16g"


def test_several_models_on_board_all_make_a_matrix_in_model_major_order():
    m = plan_models(["qwen3-0.6b", "qwen3-8b"], "all", quant="w8a8")
    assert isinstance(m, PlanMatrix) and "rk3588-8g" in m.boards
    j = m.boards.index("rk3588-8g")
    assert [m.cell(i, j).model.name for i in range(2)] == ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"]
    assert m.cell(0, j).fits is True and m.cell(1, j).fits is False
    assert m.fits is False and m.to_dict()["kind"] == "edgeinfer.plan_matrix"
    planned = [c for c in m.plans if isinstance(c, Plan)]
    assert all(c.suggestions is None for c in planned)  # a matrix plans without suggestions
    assert all(c["suggestions"] == {} for c in m.to_dict()["plans"] if "error" not in c)


def test_several_models_on_one_named_board_make_a_chain():
    c = plan_models(["qwen3-0.6b", "qwen3-8b"], "rk3588-8g", quant="w8a8")
    assert isinstance(c, ChainPlan) and [m.name for m in c.members] == ["qwen3-0.6b", "qwen3-8b"]
    assert c.fits is False and c.to_dict()["kind"] == "edgeinfer.plan_chain"


def test_board_all_turns_a_board_refusal_into_a_cell_and_a_named_board_raises():
    m = plan_models(["qwen3-0.6b"], "all", quant="Q4_K_M")
    errors = [c for c in m.to_dict()["plans"] if "error" in c]
    assert errors and all(set(c) == {"model", "board", "error"} for c in errors)
    assert [c.board for c in m.plans if isinstance(c, RefusedCell)] == [c["board"]["name"] for c in errors]
    with pytest.raises(InputError):
        plan_models(["qwen3-0.6b", "qwen3-8b"], errors[0]["board"]["name"], quant="Q4_K_M")


@pytest.mark.parametrize("opt, value", [("ctx", 0), ("batch", -2)])
def test_bad_sizes_are_refused_before_any_model_is_resolved(opt, value):
    with pytest.raises(InputError, match=f"--{opt} must be a positive integer"):
        plan_models(["acme/nothing-here"], "rk3588-8g", **{opt: value})
