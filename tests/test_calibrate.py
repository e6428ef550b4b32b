"""`edgeinfer calibrate`: constants fitted to measurements, written as a board profile `plan` uses.

Synthetic measurements are made by hand from the parent board's published model (t0 and bandwidth
fraction in edgeinfer/data/speed_constants.json) with the bandwidth slowed by a known factor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgeinfer.cli import cli
from edgeinfer.cli.calibrate import calibrate_cmd
from edgeinfer.cli.plan import plan_cmd
from edgeinfer.planning import planner
from edgeinfer.planning.boards import get_board, load_board_file

BOARD = "rk3588-16g"
RUNTIME = "rkllm"  # the runtime rows without one were measured with (calibrate.decoder_runtime)
CONSTS = json.loads((Path(planner.__file__).parents[1] / "data" / "speed_constants.json").read_text())
T0 = CONSTS["speed"]["rk3588/rkllm/w8a8"]["t0_ms"] / 1000  # the parent's fixed time per token
SLOW = 0.55  # the board under test reaches 55 % of the parent's effective bandwidth (a DDR governor, say)


def run(*args: str):
    cli.add_command(calibrate_cmd)
    cli.add_command(plan_cmd)
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def slowed(model: str, ctx: int = 192) -> float:
    """Decode tok/s of the parent's prediction with the bandwidth term divided by SLOW (by hand)."""
    fast = planner.plan(model, BOARD, quant="w8a8", ctx=ctx, runtime=RUNTIME,
                        suggest=False).estimates.decode_tokens_per_s
    return 1 / (T0 + (1 / fast - T0) / SLOW)


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"rows": rows}))
    return path


@pytest.fixture(scope="module")
def slow_profile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cal")
    rows = [{"board": BOARD, "model": m, "quant": "w8a8", "prompt": 128, "ctx": 192, "decode": round(slowed(m), 4)}
            for m in ("qwen2.5-0.5b", "tinyllama-1.1b", "qwen3-4b")]
    out = d / "slow.yaml"
    r = run("calibrate", str(write_rows(d / "rows.yaml", rows)), "--board", BOARD, "-o", str(out))
    assert r.exit_code == 0, r.output
    return out


def test_calibration_recovers_the_bandwidth_fraction(slow_profile: Path) -> None:
    b = load_board_file(slow_profile)
    c = b.runtimes["rkllm"].speed["w8a8"]
    assert c.bw_fraction == pytest.approx(CONSTS["speed"]["rk3588/rkllm/w8a8"]["bw_fraction"] * SLOW, rel=0.01)
    assert c.t0_ms / 1000 == pytest.approx(T0, rel=0.02)
    assert b.calibration["parent"] == BOARD
    assert [r["model"] for r in b.calibration["rows"]] == ["qwen2.5-0.5b", "tinyllama-1.1b", "qwen3-4b"]
    assert all(abs(r["decode_error_pct"]) < 1 for r in b.calibration["rows"])
    assert all(abs(r["decode_error_pct"]) > 30 for r in b.calibration["rows_before"])


def test_calibration_moves_other_models_by_the_same_fraction(slow_profile: Path) -> None:
    for model in ("qwen3-8b", "phi-3-mini-4k-instruct"):  # never measured
        p = planner.plan(model, str(slow_profile), quant="w8a8", ctx=1024, runtime=RUNTIME, suggest=False)
        assert p.estimates.decode_tokens_per_s == pytest.approx(slowed(model, 1024), rel=0.02)
        assert "user calibration" in p.estimates.basis
        # its own error bar: the rows were made from the model, so it meets them in-sample
        assert p.estimates.error_basis == "user calibration: in-sample on 3 row(s), not left out"
        assert p.estimates.decode_error_pct < 1


def test_one_row_fits_only_a_bandwidth_scale(tmp_path: Path) -> None:
    rows = [{"model": "qwen3-1.7b", "quant": "w8a8", "ctx": 300, "decode": round(slowed("qwen3-1.7b", 300), 4)}]
    out = tmp_path / "one.yaml"
    r = run("calibrate", str(write_rows(tmp_path / "r.yaml", rows)), "--board", BOARD, "-o", str(out))
    assert r.exit_code == 0, r.output
    b = load_board_file(out)
    c = b.runtimes["rkllm"].speed["w8a8"]
    assert c.t0_ms / 1000 == pytest.approx(T0)  # kept from the parent
    assert b.calibration["groups"]["rkllm/w8a8"]["bandwidth_scale_vs_parent"] == pytest.approx(SLOW, rel=0.005)


def test_one_row_says_it_is_trusted_fully_and_needs_force_to_move_estimates_over_2x(tmp_path: Path) -> None:
    """A row at a quarter of the parent's bandwidth term would move every estimate ~4×: refused in one line
    (nothing written) unless --force or a second row; the printed trust says how much one row counts."""
    slow = 0.25
    fast = planner.plan("qwen3-1.7b", BOARD, quant="w8a8", ctx=300, runtime=RUNTIME,
                        suggest=False).estimates.decode_tokens_per_s
    decode = round(1 / (T0 + (1 / fast - T0) / slow), 4)
    one = [{"model": "qwen3-1.7b", "quant": "w8a8", "ctx": 300, "decode": decode}]
    rows, out = write_rows(tmp_path / "r.yaml", one), tmp_path / "one.yaml"
    r = run("calibrate", str(rows), "--board", BOARD, "-o", str(out))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "--force" in r.output and "more than 2×" in r.output
    assert not out.exists()
    r = run("calibrate", str(rows), "--board", BOARD, "-o", str(out), "--force")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # rich wraps lines off a terminal
    assert "trust: one row, trusted fully" in text and "accepted with --force" in text
    assert load_board_file(out).calibration["groups"]["rkllm/w8a8"]["bandwidth_scale_vs_parent"] == \
        pytest.approx(slow, rel=0.005)
    # a second row (another model, the same slow board) checks the first: no --force needed
    two = one + [{"model": "qwen3-4b", "quant": "w8a8", "ctx": 300,
                  "decode": round(1 / (T0 + (1 / planner.plan("qwen3-4b", BOARD, quant="w8a8", ctx=300,
                                                                runtime=RUNTIME, suggest=False)
                                                  .estimates.decode_tokens_per_s - T0) / slow), 4)}]
    r = run("calibrate", str(write_rows(tmp_path / "r2.yaml", two)), "--board", BOARD, "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["groups"]["rkllm/w8a8"]["trust"].startswith("2 rows of 2 sizes")


def test_a_format_without_rows_moves_by_the_measured_scale(tmp_path: Path) -> None:
    """RK3576 has packaged w8a8 and w4a16 constants: one w8a8 row slows w4a16 by the same scale."""
    board = "rk3576-8g"
    t0 = CONSTS["speed"]["rk3576/rkllm/w8a8"]["t0_ms"] / 1000
    fast = planner.plan("qwen3-1.7b", board, quant="w8a8", ctx=300, runtime=RUNTIME,
                        suggest=False).estimates.decode_tokens_per_s
    decode = 1 / (t0 + (1 / fast - t0) / SLOW)
    rows = [{"model": "qwen3-1.7b", "quant": "w8a8", "ctx": 300, "decode": round(decode, 4)}]
    out = tmp_path / "one.yaml"
    r = run("calibrate", str(write_rows(tmp_path / "r.yaml", rows)), "--board", board, "-o", str(out))
    assert r.exit_code == 0, r.output
    b = load_board_file(out)
    assert b.calibration["groups"]["rkllm/w8a8"]["bandwidth_scale_vs_parent"] == pytest.approx(SLOW, rel=0.005)
    g = CONSTS["speed"]["rk3576/rkllm/w4a16"]["bw_fraction"]
    assert b.runtimes["rkllm"].speed["w4a16"].bw_fraction == pytest.approx(g * SLOW, rel=0.005)


def test_measured_memory_sets_the_runtime_overhead(tmp_path: Path) -> None:
    extra_mib = 300.0
    rows = []
    for m in ("qwen2.5-0.5b", "tinyllama-1.1b"):
        bd = planner.plan(m, BOARD, quant="w8a8", ctx=192, runtime=RUNTIME, suggest=False).breakdown
        mem = (bd["weights"] + bd["kv_cache"] + bd["activations"]) / 2**20 + extra_mib
        rows.append({"model": m, "quant": "w8a8", "ctx": 192, "decode": round(slowed(m), 3), "mem_mib": mem})
    out = tmp_path / "mem.yaml"
    r = run("calibrate", str(write_rows(tmp_path / "r.yaml", rows)), "--board", BOARD, "-o", str(out))
    assert r.exit_code == 0, r.output
    assert load_board_file(out).runtimes["rkllm"].overhead_mib.value == pytest.approx(extra_mib, abs=0.1)
    p = planner.plan("qwen3-0.6b", str(out), quant="w8a8", ctx=192, runtime=RUNTIME, suggest=False)
    assert p.breakdown["runtime"] == int(extra_mib * 2**20)


def test_csv_rows_and_plan_text_say_user_calibration(tmp_path: Path) -> None:
    csv = tmp_path / "rows.csv"
    csv.write_text("board,model,quant,prompt,ctx,decode,ttft_ms,mem_mib\n"
                   f"{BOARD},qwen2.5-0.5b,w8a8,128,192,{slowed('qwen2.5-0.5b'):.3f},300,\n"
                   f"{BOARD},qwen3-4b,w8a8,128,192,{slowed('qwen3-4b'):.3f},,\n")
    out = tmp_path / "p.yaml"
    assert run("calibrate", str(csv), "--board", BOARD, "-o", str(out)).exit_code == 0
    text = run("plan", "qwen3-1.7b", "--board", str(out), "--ctx", "512").output
    assert "user calibration" in text


BAD = {
    "empty": "rows: []\n",
    "not rows": "hello: world\n",
    "garbage number": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: fast}\n",
    "negative": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: -3}\n",
    "missing decode": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192}\n",
    "unknown field": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: 9, speed: 3}\n",
    "same size apart": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: 10}\n"
                       "- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: 20}\n",
    "bigger is faster": "rows:\n- {model: qwen3-0.6b, quant: w8a8, ctx: 192, decode: 10}\n"
                        "- {model: qwen3-8b, quant: w8a8, ctx: 192, decode: 20}\n",
    "faster than memory": "rows:\n- {model: qwen3-8b, quant: w8a8, ctx: 192, decode: 500}\n",
    "wrong scheme": "rows:\n- {model: qwen3-0.6b, quant: w4a16, ctx: 192, decode: 9}\n",
    "not yaml": "rows: [\n",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_measurements_one_line_exit_2(tmp_path: Path, case: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(BAD[case])
    r = run("calibrate", str(f), "--board", BOARD, "-o", str(tmp_path / "out.yaml"))
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "out.yaml").exists()


def test_board_without_bandwidth_cannot_be_calibrated(tmp_path: Path) -> None:
    prof = yaml.safe_load((Path(__file__).resolve().parents[1] / "boards" / f"{BOARD}.yaml").read_text())
    del prof["bandwidth_gbps"]
    (tmp_path / "nobw.yaml").write_text(yaml.safe_dump({**prof, "name": "nobw"}))
    f = write_rows(tmp_path / "m.yaml", [{"model": "qwen3-0.6b", "quant": "w8a8", "ctx": 64, "decode": 9}])
    r = run("calibrate", str(f), "--board", str(tmp_path / "nobw.yaml"), "-o", str(tmp_path / "o.yaml"))
    assert r.exit_code == 2 and "bandwidth" in r.output, r.output


def test_rows_of_other_boards_are_skipped_and_noted(tmp_path: Path) -> None:
    rows = [{"board": "rk3576-8g", "model": "qwen3-0.6b", "quant": "w4a16", "ctx": 192, "decode": 9},
            {"board": BOARD, "model": "qwen3-0.6b", "quant": "w8a8", "ctx": 192, "decode": 20}]
    r = run("calibrate", str(write_rows(tmp_path / "m.yaml", rows)), "--board", BOARD, "-o", str(tmp_path / "o.yaml"),
            "--json", "--force")  # the one row moves estimates > 2×
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["rows"]) == 1 and any("rk3576-8g" in n for n in d["notes"])
    assert get_board(str(tmp_path / "o.yaml")).name == f"{BOARD}-calibrated"
    again = run("calibrate", str(tmp_path / "m.yaml"), "--board", BOARD, "-o", str(tmp_path / "o.yaml"),
                "--name", "mine", "--force")
    assert again.exit_code == 0, again.output  # an existing profile is overwritten
    assert get_board(str(tmp_path / "o.yaml")).name == "mine"


def test_calibrate_and_planning_new_architectures_stay_light(tmp_path: Path) -> None:
    from helpers import HEAVY, imported_modules

    rows = write_rows(tmp_path / "m.yaml", [{"model": "qwen3-0.6b", "quant": "w8a8", "ctx": 192, "decode": 20}])
    out = tmp_path / "o.yaml"
    code = ("import sys\nfrom edgeinfer.cli import main\n"
            f"for argv in (['calibrate', {str(rows)!r}, '--board', 'rk3588-16g', '-o', {str(out)!r}, '--force'],\n"
            f"             ['plan', 'qwen2.5-vl-3b', '--board', {str(out)!r}, '--image', '640x480'],\n"
            "             ['plan', 'deepseek-v2-lite', '--board', 'rk3588-16g']):\n"
            "    sys.argv = ['edgeinfer', *argv]\n"
            "    try:\n        main()\n    except SystemExit:\n        pass")
    heavy = imported_modules(code) & set(HEAVY)
    assert not heavy, f"calibrate/plan pulled in {sorted(heavy)}"
    assert out.is_file()
