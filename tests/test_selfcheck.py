"""The planner checks itself after `edgeinfer bench` of a decoder bundle, and the bench JSON's
self-check rows calibrate a board profile (`edgeinfer calibrate`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgeinfer.cli import invoke
from edgeinfer.planning import planner
from edgeinfer.planning.boards import host_board, load_board_file


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = invoke(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> Path:
    """This machine as a board profile with a fixed bandwidth claim (a stand-in figure: the host's own is
    measured and varies), so that the planner predicts decode speed here. Generous, because the tiny model's
    weights stay in the CPU caches: calibration refuses rows that imply more than 1.5 × the claimed bandwidth."""
    d = host_board().model_dump(mode="json", exclude={"origin", "calibration"})
    d.update(name="cpu-box", bandwidth_gbps={"value": 200.0, "source": "test stand-in: assumed 200 GB/s"})
    for rt in d["runtimes"].values():  # no speed model until calibrated (not the host-cpu constants)
        rt["speed_group"] = None
    path = tmp_path_factory.mktemp("board") / "cpu-box.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


@pytest.fixture(scope="module")
def bench_json(tiny_qwen3_host_bundle, cpu_profile, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    rc = invoke(["bench", str(tiny_qwen3_host_bundle), "--board", str(cpu_profile), "--prompt-lengths", "16",
                 "--new-tokens", "16", "--repeat", "2", "--json", "-o", str(out)])
    assert rc == 0
    return out


def test_bench_records_the_plans_predictions_next_to_the_measurements(bench_json: Path, cpu_profile: Path,
                                                                      tiny_qwen3_host_bundle: Path) -> None:
    r = json.loads(bench_json.read_text())
    sc = r["self_check"]
    assert sc["board"] == "cpu-box" and sc["scheme"] == "fp32" and sc["context"] == 256
    (c,) = sc["comparisons"]
    measured = r["results"][0]
    assert c["decode_tokens_per_s"] == measured["decode_tokens_per_s"]
    assert c["peak_mib"] == pytest.approx(measured["peak_rss_bytes"] / 2**20, abs=0.1)
    # the prediction is the plan's for the same board, model, scheme and context (weights + runtime), with the KV
    # of the 32 positions the run wrote (onnxruntime's cache pages are resident as written: decoder_kv_lazy) and
    # the activations of its 16-token prompt
    cfg = tiny_qwen3_host_bundle / "tokenizer" / "config.json"
    p = planner.plan(str(cfg), str(cpu_profile), quant="fp32", ctx=256, suggest=False)
    bd = p.breakdown
    kv_pos = 4 * 2 * 2 * 64 * 2  # layers × (key, value) × KV heads × head_dim × fp16 bytes
    assert bd["kv_cache"] == 256 * kv_pos
    prompt16 = planner.plan(str(cfg), str(cpu_profile), quant="fp32", ctx=256, prefill_chunk=16, suggest=False)
    held = bd["weights"] + bd["runtime"] + 32 * kv_pos + prompt16.breakdown["activations"]
    assert c["predicted_peak_mib"] == pytest.approx(held / 2**20, abs=0.1)
    assert c["predicted_peak_mib"] < (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / 2**20
    assert c["peak_error_pct"] == pytest.approx((c["predicted_peak_mib"] - c["peak_mib"]) / c["peak_mib"] * 100,
                                                abs=0.1)
    (row,) = sc["rows"]
    assert row["decode"] == measured["decode_tokens_per_s"] and row["ctx"] == 32 and row["mem_ctx"] == 256
    # the host's CPU is a host-family board's own device: a board figure, and its rows calibrate
    assert sc["ran_on"] == "host CPU" and sc["board_figure"] is True and sc["device"] == r["device"]


def test_bench_json_calibrates_the_board(bench_json: Path, cpu_profile: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cal.yaml"
    rc, _, err = _run(capsys, "calibrate", str(bench_json), "--board", str(cpu_profile), "-o", str(out), "--json")
    assert rc == 0, err
    b = load_board_file(out)
    (row,) = b.calibration["rows"]
    measured = json.loads(bench_json.read_text())["results"][0]
    # one row: the bandwidth is solved so that the row is met (t0 0: the parent has no constants)
    assert row["predicted_decode"] == pytest.approx(measured["decode_tokens_per_s"], rel=0.01)
    # memory: the runtime overhead absorbs what the plan did not see, so the peak is met too
    assert row["predicted_mem_mib"] == pytest.approx(measured["peak_rss_bytes"] / 2**20, rel=0.01)
    assert b.calibration["rows_before"][0]["predicted_decode"] is None  # the parent had no speed model


def test_bench_board_option_is_refused_for_a_model_directory(capsys) -> None:
    from edgeinfer.testing.llm import model_dir

    rc, _, err = _run(capsys, "bench", str(model_dir()), "--board", "rk3588-16g", "--ctx", "32",
                      "--prompt-lengths", "4", "--new-tokens", "2", "--repeat", "1", "--threads", "1")
    assert rc == 2 and "decoder bundles" in err


# --- decode speed: where a figure ran, and what its ratio to the plan may say -------------------------------

def _report(device: str, decode: float = 40.0) -> dict:
    """A bench report as edgeinfer.run.generation.bench writes it (one prompt length), measured on ``device``."""
    return {"device": device, "results": [{"prompt_tokens": 16, "new_tokens": 16, "decode_tokens_per_s": decode,
                                           "ttft_ms": 50.0, "peak_rss_bytes": 100 * 2**20}]}


def _tiny_spec():
    from edgeinfer.planning.models.hf import read_config, spec_from_config
    from edgeinfer.testing.llm import model_dir

    cfg = read_config(model_dir() / "config.json")
    return spec_from_config(cfg, "tiny-qwen3", "test"), cfg


@pytest.mark.parametrize("device, where", [("cpu", "host CPU"), ("CPU", "host CPU"), ("simulator", "simulator"),
                                           ("stand-in library on the host CPU", "stand-in library"),
                                           ("npu:rk3588", "device"), ("NPU", "device")])
def test_ran_on_names_where_a_figure_was_measured(device: str, where: str) -> None:
    from edgeinfer.planning.selfcheck import ran_on

    assert ran_on(device) == where


def test_a_host_figure_against_a_board_with_constants_is_labelled_not_the_boards() -> None:
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.selfcheck import self_check

    spec, cfg = _tiny_spec()
    b = get_board("rk3588-8g")
    sc = self_check(_report("cpu"), spec, cfg, b, "w8a8", 256, "test", runtime="rkllm")
    (c,) = sc["comparisons"]
    predicted = planner.plan(spec, b, quant="w8a8", ctx=32, runtime="rkllm", suggest=False).estimates
    assert c["predicted_decode_tokens_per_s"] == predicted.decode_tokens_per_s is not None
    assert c["decode_ratio"] == pytest.approx(40.0 / c["predicted_decode_tokens_per_s"], rel=1e-3)
    assert (sc["ran_on"], sc["device"], sc["board_figure"]) == ("host CPU", "cpu", False)
    assert any("says nothing about the board's speed constants" in n for n in sc["notes"])
    assert sc["rows"] == []  # a host figure must not calibrate rk3588's constants


def test_no_speed_constants_means_no_prediction_and_no_ratio() -> None:
    from edgeinfer.planning.selfcheck import self_check, speed_check

    spec, cfg = _tiny_spec()
    host = host_board()
    host.runtimes[host.default_runtime].speed_group = None  # no constants, fitted or inline
    sc = self_check(_report("cpu"), spec, cfg, host, "fp32", 256, "test")
    (c,) = sc["comparisons"]
    assert c["predicted_decode_tokens_per_s"] is None and c["decode_ratio"] is None
    assert any(n.startswith("no decode prediction on host") for n in sc["notes"])
    one = speed_check(40.0, "cpu", spec, host, "fp32", 32, None, "test")
    assert one["predicted_decode_tokens_per_s"] is None and one["ratio"] is None
    assert one["note"].startswith("no decode prediction on host")


def test_speed_check_ratio_is_the_two_reported_figures_and_its_line_says_where_it_ran() -> None:
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.selfcheck import speed_check, speed_line

    spec, _ = _tiny_spec()
    sc = speed_check(123.456, "simulator", spec, get_board("rk3588-8g"), "w8a8", 40, "rkllm", "test decode")
    assert set(sc) >= {"board", "runtime", "scheme", "ctx", "measured_at", "decode_tokens_per_s",
                       "predicted_decode_tokens_per_s", "ratio", "ran_on", "device", "board_figure", "note"}
    assert (sc["runtime"], sc["ctx"], sc["decode_tokens_per_s"], sc["ran_on"]) == ("rkllm", 40, 123.46, "simulator")
    assert sc["ratio"] == pytest.approx(sc["decode_tokens_per_s"] / sc["predicted_decode_tokens_per_s"], rel=1e-3)
    assert sc["board_figure"] is False and "a simulator figure" in speed_line(sc)
    assert sc["others_busy_cpus"] is None and "other work" not in sc["note"]
    busy = speed_check(123.456, "simulator", spec, get_board("rk3588-8g"), "w8a8", 40, "rkllm", "test decode",
                       others_busy=64.0)  # more than any machine running this has: always said
    assert busy["others_busy_cpus"] == 64.0 and "other work kept 64 of this machine's" in speed_line(busy)
