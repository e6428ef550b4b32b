"""The prefill model (edgeinfer/planning/prefill.py, docs/planner.md#speed-model): TTFT = t0 + prompt × 2 ×
params / (factor × peak), t0 fitted where the measured prompts span 4×, borrowed where they do not, its
leave-one-source-out error, and plan giving the time to the first token. Synthetic rows (expected values worked
out by hand here) and the committed published rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgeinfer.cli import cli
from edgeinfer.cli.calibrate import calibrate_cmd
from edgeinfer.cli.plan import plan_cmd
from edgeinfer.planning import planner, prefill, speed_fit
from edgeinfer.planning.boards import get_board, load_board_file
from edgeinfer.planning.models import resolve
from edgeinfer.planning.speed_fit import Point

ROWS = Path(planner.__file__).parents[2] / "bench" / "data" / "rows_intel.yaml"
S = 1e-4  # seconds a prompt token takes at the whole peak (2 × params / peak)


def exact(prompts, t0_ms: float, factor: float, s: float = S) -> list[prefill.Measured]:
    return [prefill.Measured(p, t0_ms / 1000 + p * s / factor, s) for p in prompts]


def test_t0_and_the_factor_come_back_from_prompts_of_32_and_1024_tokens() -> None:
    c = prefill.fit(exact((32, 1024), 50.0, 0.4) + exact((32, 1024), 50.0, 0.4, s=3e-4))
    assert c["prefill_t0_ms"] == pytest.approx(50.0, abs=0.01)
    assert c["prefill_factor"] == pytest.approx(0.4, rel=1e-4)
    assert c["prefill_fit"] == "t0 fitted on prompts of 32-1024 tokens"
    # a 512-token prompt of the second model: 50 ms + 512 × 3e-4 / 0.4 s = 434 ms
    assert prefill.ttft_seconds(c, 512, 3e-4) == pytest.approx(0.434, rel=1e-4)


def test_prompts_of_one_length_keep_t0_at_zero_and_take_the_median_factor() -> None:
    c = prefill.fit(exact((128,), 0.0, 0.2) + exact((128,), 0.0, 0.3) + exact((128,), 0.0, 0.5))
    assert c["prefill_t0_ms"] == 0.0 and c["prefill_factor"] == pytest.approx(0.3, rel=1e-4)
    assert c["prefill_fit"] == "t0 0: prompts of one length and no t0 to borrow"


def test_a_t0_fitted_as_negative_is_held_at_zero() -> None:
    # TTFTs exactly proportional to the prompt, less 5 ms: a line through them crosses below zero
    ms = [prefill.Measured(p, p * S / 0.5 - 0.005, S) for p in (100, 400, 1600)]
    assert prefill.fit(ms)["prefill_t0_ms"] == 0.0


def test_ttfts_that_fall_as_the_prompt_grows_fit_a_rate_alone() -> None:
    # contradictory rows (a 1024-token prompt faster than a 32-token one) must not give a negative factor
    c = prefill.fit([prefill.Measured(32, 0.200, S), prefill.Measured(1024, 0.150, S)])
    assert c["prefill_t0_ms"] == 0.0 and c["prefill_factor"] > 0


def pt(row: str, source: str, prompt: int, ttft_s: float) -> Point:
    return Point(row, source, "b", 100e9, 1e9, 0.02, prefill.Measured(prompt, ttft_s, S))


def test_one_length_borrows_the_t0_of_the_same_runtime_and_says_from_where() -> None:
    by_key = {"g/rt/w4a16": [pt("a", "s1", 32, 0.060 + 32 * S / 0.5), pt("b", "s1", 1024, 0.060 + 1024 * S / 0.5)],
              "g/rt/w8a16": [pt("c", "s2", 256, 0.060 + 256 * S / 0.25)]}
    table = speed_fit.fit_table(by_key)
    w8 = table["g/rt/w8a16"]
    assert w8["prefill_t0_ms"] == pytest.approx(60.0, abs=0.01)
    assert w8["prefill_factor"] == pytest.approx(0.25, rel=1e-4)
    assert w8["prefill_fit"] == "t0 borrowed from g/rt/w4a16"


def test_a_borrowed_t0_longer_than_a_measured_ttft_is_not_used() -> None:
    by_key = {"g/rt/w4a16": [pt("a", "s1", 32, 0.500 + 32 * S), pt("b", "s1", 1024, 0.500 + 1024 * S)],
              "g/rt/w8a16": [pt("c", "s2", 256, 0.100)]}
    w8 = speed_fit.fit_table(by_key)["g/rt/w8a16"]
    assert w8["prefill_t0_ms"] == 0.0
    assert w8["prefill_fit"] == "t0 0: the t0 of g/rt/w4a16 is longer than a measured TTFT"


def test_the_prefill_error_is_left_out_by_source_and_needs_two() -> None:
    one = {"g/rt/w4a16": [pt("a", "s1", 32, 0.060 + 32 * S / 0.5), pt("b", "s1", 1024, 0.060 + 1024 * S / 0.5)]}
    assert speed_fit.loso_errors(one)["g/rt/w4a16"]["prefill_error_basis"] == "one source: not validated"
    # a second source measures the same prompts 20 % slower: each predicts the other 1/1.2 - 1 or 1.2 - 1 off
    two = {"g/rt/w4a16": one["g/rt/w4a16"] + [pt("c", "s2", 32, 1.2 * (0.060 + 32 * S / 0.5)),
                                              pt("d", "s2", 1024, 1.2 * (0.060 + 1024 * S / 0.5))]}
    e = speed_fit.loso_errors(two)["g/rt/w4a16"]
    assert e["prefill_error_pct"] == pytest.approx((20 + 100 / 6) / 2, abs=0.1)
    assert e["prefill_error_basis"] == "leave-one-source-out, 4 rows from 2 sources"


def published_pairs() -> list[tuple[dict, dict]]:
    """Every model OpenVINO's published tables measured at a 31-33- and a 1023-1025-token prompt on one board."""
    rows = [r for r in yaml.safe_load(ROWS.read_text())["rows"] if r.get("fit") and r.get("ttft_ms")
            and r.get("prompt")]
    same = ("board", "runtime", "model", "quant")
    pairs = []
    for s in (r for r in rows if r["prompt"] in (31, 32, 33)):
        long = [r for r in rows if all(r[k] == s[k] for k in same) and r["prompt"] in (1023, 1024, 1025)]
        pairs += [(s, long[0])] if long else []
    return pairs


def test_plan_grows_the_ttft_with_the_prompt_as_published_rows_do() -> None:
    # a prompt 32x as long takes 1.4-24x as long to the first token on these rows: the fixed cost of a request
    # dominates short prompts; a rate alone (t0 0) would say 32x for every one of them
    ratios = []
    for short, long in published_pairs():
        ms = [planner.plan(r["model"], r["board"], quant=r["quant"], runtime=r["runtime"], ctx=2048,
                           prompt=r["prompt"], suggest=False).estimates.ttft_ms()[0]["ms"] for r in (short, long)]
        ratios.append((ms[1] / ms[0], long["ttft_ms"] / short["ttft_ms"]))
    assert len(ratios) >= 100
    assert max(m for _, m in ratios) < 32
    within_2x = sum(1 for p, m in ratios if 0.5 < p / m < 2)
    assert within_2x >= 0.8 * len(ratios), ratios  # 120 of 136 on the committed rows
    closer = sum(1 for p, m in ratios if abs(math.log(p / m)) < abs(math.log(32 / m)))
    assert closer >= 0.95 * len(ratios), ratios  # 135 of 136


def test_plan_text_and_json_give_the_time_to_the_first_token() -> None:
    args = ["plan", "qwen3-8b", "--board", "core-ultra-258v", "--runtime", "openvino-gpu", "--quant", "w4a16",
            "--ctx", "4096"]
    r = cli_run(*args, "--json")
    assert r.exit_code == 0, r.output
    e = json.loads(r.output)["estimates"]
    assert [t["prompt_tokens"] for t in e["ttft_ms"]] == [128, 4096]
    assert e["prefill_t0_ms"] > 10 and e["prefill_error_pct"] > 0
    long = e["ttft_ms"][1]["ms"]
    assert long == pytest.approx(e["prefill_t0_ms"] + 4096 / e["prefill_tokens_per_s"] * 1000, rel=1e-3)
    text = " ".join(cli_run(*args).output.split())  # rich wraps at the terminal's width
    assert f"{long / 1000:.3g} s at 4096 (the context)" in text
    assert "s at a 128-token prompt" in text and "leave-one-source-out" in text
    one = json.loads(cli_run(*args, "--prompt", "1000", "--json").output)["estimates"]["ttft_ms"]
    assert [t["prompt_tokens"] for t in one] == [1000]


@pytest.mark.parametrize("model,prompt,needle", [
    ("qwen3-8b", "5000", "--prompt 5000 is longer than the context (4096 tokens)"),
    ("qwen3-8b", "0", "--prompt must be a positive integer"),
    ("all-minilm-l6-v2", "64", "--prompt goes with a decoder: an encoder gives no first token")])
def test_a_prompt_the_plan_cannot_take_is_one_line_exit_2(model: str, prompt: str, needle: str) -> None:
    ctx = [] if model.startswith("all-") else ["--ctx", "4096"]
    r = cli_run("plan", model, "--board", "core-ultra-258v", *ctx, "--prompt", prompt)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_the_matrix_gives_each_cells_time_to_the_first_token_of_the_prompt() -> None:
    first = planner.plan("qwen3-8b", "core-ultra-155h", prompt=512, suggest=False).estimates.ttft_ms()[0]
    assert first["prompt_tokens"] == 512
    text = " ".join(cli_run("plan", "qwen3-8b", "--board", "all", "--prompt", "512").output.split())
    assert f"{first['ms'] / 1000:.3g} s at 512" in text


def test_an_extrapolated_prefill_widens_its_error_bar_as_decode_does() -> None:
    # core-ultra-255h's iGPU generation has no fp16 rows: its constants are every openvino-gpu board's
    star = json.loads((Path(planner.__file__).parents[1] / "data" / "speed_constants.json").read_text())[
        "speed"]["*/openvino-gpu/fp16"]
    e = planner.plan("qwen3-8b", "core-ultra-255h", runtime="openvino-gpu", quant="fp16", suggest=False).estimates
    assert "extrapolated" in e.basis
    assert e.prefill_error_pct == pytest.approx(max(2 * star["prefill_error_pct"], 30), abs=0.05)
    assert e.prefill_error_basis.endswith(f"widened to max(2 × {star['prefill_error_pct']:g} %, 30 %)")


def test_a_chain_plan_refuses_a_prompt_in_one_line() -> None:
    r = cli_run("plan", "all-minilm-l6-v2", "qwen3-0.6b", "--board", "core-ultra-258v", "--prompt", "100")
    assert r.exit_code == 2 and "--prompt goes with one decoder's plan: a chain's plan is its memory" in r.output


def test_a_paged_plan_gives_the_time_to_the_first_token_at_its_paged_rate() -> None:
    p = planner.plan("qwen3-8b", "rk3588-8g", quant="w8a8", paging=12, storage="nvme", prompt=1024)
    e = p.estimates
    assert e.prefill_tokens_per_s < e.prefill_tokens_per_s_unpaged  # 16-token chunks page every segment in
    assert e.ttft_ms() == [{"prompt_tokens": 1024, "ms": pytest.approx(1024 / e.prefill_tokens_per_s * 1000,
                                                                        abs=0.1)}]  # RKLLM's rows: t0 0
    text = " ".join(cli_run("plan", "qwen3-8b", "--board", "rk3588-8g", "--quant", "w8a8", "--paging", "12",
                            "--storage", "nvme").output.split())
    assert f"prefill (paged) ≈ {e.prefill_tokens_per_s:.3g} tok/s; time to first token ≈" in text


def test_a_board_without_a_peak_says_why_it_has_no_prefill_estimate() -> None:
    assert planner.plan("qwen3-0.6b", "core-ultra-258v", runtime="openvino-gpu", suggest=False).estimates.ttft_ms()
    p = planner.plan("qwen3-0.6b", "host", quant="w8a16", suggest=False)
    assert p.estimates.prefill_tokens_per_s is None and p.estimates.ttft_ms() == []
    text = " ".join(cli_run("plan", "qwen3-0.6b", "--board", "host", "--quant", "w8a16").output.split())
    assert ("prefill: no estimate (host states no peak compute: `edgeinfer bench BUNDLE --json` on it, then "
            "`edgeinfer calibrate` on that report, fits its own)") in text


def test_calibrating_a_board_without_a_peak_fits_its_effective_tops(tmp_path: Path) -> None:
    params = resolve("qwen3-0.6b").params_active
    # this machine: 30 ms a request, then 0.05 tera-ops a second (2 ops a parameter a token)
    rows = [{"model": "qwen3-0.6b", "quant": "w8a16", "prompt": p, "ctx": 1100, "decode": 20.0,
             "ttft_ms": round(30 + p * 2 * params / 0.05e12 * 1000, 3)} for p in (64, 1024)]
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    out = tmp_path / "mine.yaml"
    r = cli_run("calibrate", str(path), "--board", "host", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "factor 0.05 effective TOPS (the board states no peak)" in " ".join(r.output.split())
    e = planner.plan("qwen3-0.6b", load_board_file(out), quant="w8a16", ctx=2048, prompt=512, suggest=False).estimates
    assert e.ttft_ms()[0]["ms"] == pytest.approx(30 + 512 * 2 * params / 0.05e12 * 1000, rel=1e-3)
    assert e.prefill_fraction_of_peak is None  # no peak to be a fraction of


def cli_run(*args: str):
    cli.add_command(plan_cmd)
    cli.add_command(calibrate_cmd)
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": None})  # tables unwrapped


def test_calibrate_fits_the_prefill_t0_from_a_boards_own_rows(tmp_path: Path) -> None:
    board = get_board("rk3588-16g")
    params = resolve("qwen3-0.6b").params_active
    s = 2 * params / (board.int8_tops.value * 1e12)
    # this board: 120 ms a request, then 10 % of its peak a prompt token
    rows = [{"board": "rk3588-16g", "model": "qwen3-0.6b", "quant": "w8a8", "prompt": p, "ctx": 1100,
             "decode": 14.0, "ttft_ms": round(120 + p * s / 0.10 * 1000, 3)} for p in (64, 1024)]
    path = tmp_path / "rows.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    out = tmp_path / "mine.yaml"
    r = cli_run("calibrate", str(path), "--board", "rk3588-16g", "-o", str(out))
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert "prefill: t0 120.0 ms, factor 0.1 of the board's peak — t0 fitted on prompts of 64-1024 tokens" in said
    c = load_board_file(out).runtimes["rkllm"].speed["w8a8"]
    assert c.prefill_t0_ms == pytest.approx(120, abs=0.5) and c.prefill_factor == pytest.approx(0.10, rel=1e-3)
    e = planner.plan("qwen3-0.6b", load_board_file(out), quant="w8a8", runtime="rkllm", ctx=2048, prompt=512,
                     suggest=False).estimates
    assert e.ttft_ms()[0]["ms"] == pytest.approx(120 + 512 * s / 0.10 * 1000, rel=1e-3)
