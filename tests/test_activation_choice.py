"""plan's ``suggestions.activations``: the plan's weights with int8 activations, where its runtime decodes those
faster (edgeinfer/planning/activation_choice.py, docs/planner.md "Suggestions").

The expected figures are the planner's own plans of the other scheme, made here independently of the suggestion,
and the runtime's scheme list read from the board. Since host w4a16 runs on the onnxruntime plugin's own int4 op
(edgeinfer.MatMulW4), whether w4a8 is 1.2x faster follows the rows shipped; the tests of the suggestion itself make
w4a16 slow in a stand-in of the fitted constants (its fraction of the bandwidth 0.169: onnxruntime's MatMulNBits
on fp32 activations, the rows of 2026-12-05)."""

from __future__ import annotations

import copy

import pytest

from edgeinfer.planning import planner
from edgeinfer.planning.boards import get_board
from edgeinfer.planning.planner import plan
from edgeinfer.testing.cli import run_cli

MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def slow_host_w4a16_stand_in(monkeypatch):
    constants = copy.deepcopy(planner.fitted())
    constants["speed"]["host-cpu/onnxruntime/w4a16"].update(t0_ms=0.0, bw_fraction=0.169)
    monkeypatch.setattr(planner, "fitted", lambda: constants)


@pytest.mark.parametrize("scheme, int8", [("w4a16", "w4a8")])
def test_float_activations_on_the_host_point_to_the_int8_kernels(scheme, int8, slow_host_w4a16_stand_in):
    host = get_board("host")  # one measurement of this machine's free memory for both plans
    p = plan(MODEL, host, quant=scheme, ctx=1024)
    assert p.runtime == "onnxruntime" and int8 in host.runtimes[p.runtime].schemes
    alt = plan(MODEL, host, quant=int8, ctx=1024, runtime=p.runtime, suggest=False)
    a = p.suggestions.activations
    assert a["quant"] == int8 and a["decode_tokens_per_s"] == alt.estimates.decode_tokens_per_s
    assert alt.estimates.decode_tokens_per_s >= 1.2 * p.estimates.decode_tokens_per_s
    assert a["speedup"] == pytest.approx(alt.estimates.decode_tokens_per_s / p.estimates.decode_tokens_per_s,
                                         abs=0.01)
    assert a["total_bytes"] == alt.total_bytes and a["basis"] == alt.estimates.basis


@pytest.mark.parametrize("board, scheme", [("host", "w8a8"), ("host", "fp16"), ("host", "fp32"),
                                           ("rk3576-8g", "w4a16")])
def test_no_suggestion_without_float_activations_or_an_int8_scheme_on_the_runtime(board, scheme):
    p = plan(MODEL, board, quant=scheme, ctx=1024)
    if scheme == "w4a16":  # the runtime has no w4a8 to offer
        assert "w4a8" not in get_board(board).runtimes[p.runtime].schemes
    assert p.suggestions.activations is None


def test_no_suggestion_when_the_int8_scheme_is_not_faster():
    """OpenVINO on an Intel NPU decodes w8a16 and w8a8 at one estimate (the same 8-bit weight bytes per token)."""
    p = plan(MODEL, "core-ultra-155h", quant="w8a16", ctx=1024)
    assert "w8a8" in get_board("core-ultra-155h").runtimes[p.runtime].schemes
    other = plan(MODEL, "core-ultra-155h", quant="w8a8", ctx=1024, runtime=p.runtime, suggest=False)
    assert other.fits and other.estimates.decode_tokens_per_s < 1.2 * p.estimates.decode_tokens_per_s
    assert p.suggestions.activations is None


@pytest.mark.parametrize("scheme, int8", [("w8a16", "w8a8"), ("w4a16", "w4a8")])
def test_host_float_activations_point_to_int8_exactly_when_its_plan_is_1_2x_faster(scheme, int8):
    """onnxruntime on the host runs w8a16 and w4a16 on the plugin's own ops over two digits of their activations,
    w8a8 on MLAS's int8 kernel and w4a8 on the int4 op's one digit: whether a 0.6 B model's two estimates are 1.2x
    apart depends on the rows shipped (bench/data/rows_host.yaml moves with the machine); the suggestion follows
    them."""
    p = plan(MODEL, "host", quant=scheme, ctx=1024)
    other = plan(MODEL, "host", quant=int8, ctx=1024, runtime=p.runtime, suggest=False)
    faster = other.fits and other.estimates.decode_tokens_per_s >= 1.2 * p.estimates.decode_tokens_per_s
    a = p.suggestions.activations
    assert (a is not None) == faster
    if a is not None:
        assert a["quant"] == int8 and a["decode_tokens_per_s"] == other.estimates.decode_tokens_per_s


def test_plan_and_deploy_print_it(capfd, slow_host_w4a16_stand_in):
    r = run_cli(capfd, "plan", MODEL, "--board", "host", "--quant", "w4a16", "--ctx", "1024")
    assert r.returncode == 0, r.stderr
    a = plan(MODEL, "host", quant="w4a16", ctx=1024).suggestions.activations
    assert f"faster here: --quant w4a8 (int8 activations) → decode ≈ {a['decode_tokens_per_s']:.3g} tok/s" in r.stdout
    from edgeinfer.planning.decision import summary_lines

    lines = summary_lines(plan(MODEL, "host", quant="w4a16", ctx=1024))
    assert any(ln.startswith("faster here: --quant w4a8 (int8 activations)") for ln in lines)
