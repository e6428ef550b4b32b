"""plan's ``suggestions.runtime``: another runtime of the board that decodes the plan's scheme faster here.

Since the onnxruntime plugin reads fp16 weights with its own op, no host runtime decodes a scheme 1.2x faster than
the default one with the shipped constants; the tests make onnxruntime's fp16 slow in a stand-in of the fitted
constants (its fraction of the bandwidth 0.5, as slow as the two int8 planes it ran as before), so that llama.cpp
is the faster runtime, as it was."""

from __future__ import annotations

import copy
import json

import pytest

from edgeinfer.planning import planner
from edgeinfer.planning.planner import plan
from edgeinfer.testing.cli import run_cli

pytest.importorskip("edgeinfer_llamacpp")  # the host board's llama.cpp runtime is built by that plugin


def test_with_the_shipped_constants_host_fp16_names_no_faster_runtime():
    onnx = plan("qwen3-0.6b", "host", quant="fp16", ctx=1024)
    llama = plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, runtime="llama.cpp", suggest=False)
    assert onnx.suggestions.runtime is None
    assert onnx.estimates.decode_tokens_per_s > llama.estimates.decode_tokens_per_s / 1.2


@pytest.fixture
def slow_onnxruntime_fp16_stand_in(monkeypatch):
    constants = copy.deepcopy(planner.fitted())
    constants["speed"]["host-cpu/onnxruntime/fp16"]["bw_fraction"] = 0.5
    monkeypatch.setattr(planner, "fitted", lambda: constants)


def test_host_fp16_names_llama_cpp_with_its_own_plan_figures(slow_onnxruntime_fp16_stand_in):
    onnx = plan("qwen3-0.6b", "host", quant="fp16", ctx=1024)
    llama = plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, runtime="llama.cpp", suggest=False)
    s = onnx.suggestions.runtime
    assert onnx.runtime == "onnxruntime" and s["runtime"] == "llama.cpp"
    assert s["decode_tokens_per_s"] == llama.estimates.decode_tokens_per_s
    assert s["decode_tokens_per_s"] >= 1.2 * onnx.estimates.decode_tokens_per_s
    # the host board's reserve is read from this machine at each plan: the same within what moved in between
    assert s["total_bytes"] == pytest.approx(llama.total_bytes, rel=0.01)
    # neither widens fp16 to fp32, and both hold the tied table once: onnxruntime in fp16 panels (16 bits a
    # weight) that its lookup reads too (EmbedF16)
    assert onnx.breakdown["weights"] == llama.breakdown["weights"]


def test_the_faster_runtime_itself_and_a_scheme_no_other_runtime_takes_get_none(slow_onnxruntime_fp16_stand_in):
    assert plan("qwen3-0.6b", "host", quant="fp16", ctx=1024, runtime="llama.cpp").suggestions.runtime is None
    assert plan("qwen3-0.6b", "host", quant="w8a8", ctx=1024).suggestions.runtime is None  # llama.cpp: gguf:Q8_0


def test_plan_prints_it_and_json_carries_it(capfd, slow_onnxruntime_fp16_stand_in):
    r = run_cli(capfd, "plan", "qwen3-0.6b", "--board", "host", "--quant", "fp16", "--ctx", "1024")
    assert r.returncode == 0 and "faster here: --runtime llama.cpp" in r.stdout
    j = run_cli(capfd, "plan", "qwen3-0.6b", "--board", "host", "--quant", "fp16", "--ctx", "1024", "--json")
    assert json.loads(j.stdout)["suggestions"]["runtime"]["runtime"] == "llama.cpp"


def test_deploy_announces_it_before_converting(slow_onnxruntime_fp16_stand_in):
    from edgeinfer.planning.decision import summary_lines

    lines = summary_lines(plan("qwen3-0.6b", "host", quant="fp16", ctx=1024))
    assert lines[0].startswith("plan: Qwen/Qwen3-0.6B on host: onnxruntime fp16")
    assert lines[-1].startswith("faster here: --runtime llama.cpp decodes fp16 at ≈")
    assert not any("faster" in ln for ln in summary_lines(plan("qwen3-0.6b", "host", quant="fp32", ctx=1024)))
