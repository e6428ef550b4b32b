"""The speed model v3 (docs/planner.md#speed-model): constants that transfer between boards, t0 and the
bandwidth term recovered from rows of several sizes, labelled extrapolation with widened error bars,
leave-one-source-out error bars, and plan showing them. Pure arithmetic on synthetic rows (expected values
worked out by hand here), no model converted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgeinfer.planning import planner, speed, speed_fit
from edgeinfer.planning.speed_fit import Point
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()
GB = 1e9
CONSTS = json.loads((Path(planner.__file__).parents[1] / "data" / "speed_constants.json").read_text())


def rows(board: str, board_gbps: float, t0_ms: float, bw_gbps: float, sizes_gb, source: str = "s") -> list[Point]:
    """Exact rows: seconds per token = t0 + bytes / BW_eff."""
    return [Point(f"{board}-{x}", source, board, board_gbps * GB, x * GB, t0_ms / 1000 + x / bw_gbps)
            for x in sizes_gb]


def test_a_software_bound_runtime_keeps_its_bandwidth_on_a_2x_board() -> None:
    # fitted on an 800 GB/s board where it reaches 250 GB/s: on 1600 GB/s it stays at 250 (the cap), on a
    # 400 GB/s board it gets 250/800 of it = 125 GB/s
    c = speed_fit.fit_points(rows("910b4", 800, 0.5, 250, (1, 4, 16)))
    assert c["t0_ms"] == pytest.approx(0.5, abs=1e-3)
    assert speed.effective_bandwidth(c, 1600 * GB) == pytest.approx(250 * GB, rel=1e-3)
    assert speed.effective_bandwidth(c, 400 * GB) == pytest.approx(125 * GB, rel=1e-3)
    # 8 GB per step on the 1600 GB/s board: 1 / (0.5 ms + 8/250 s) = 30.769 tok/s
    assert 1 / speed.step_seconds(c, 1600 * GB, 8 * GB) == pytest.approx(30.769, rel=1e-3)
    assert "never faster than seen there" in c["fit"]


def test_a_hardware_bound_runtime_fitted_on_two_boards_scales_with_memory() -> None:
    # 80 % of the board's bandwidth on a 100 and a 200 GB/s board, t0 2 ms
    pts = rows("a", 100, 2, 80, (1, 2, 4), "pub-a") + rows("b", 200, 2, 160, (1, 2, 4), "pub-b")
    c = speed_fit.fit_points(pts)
    assert c["bw_cap_gbps"] is None and c["bw_fraction"] == pytest.approx(0.8, rel=1e-3)
    assert "hardware-bound" in c["fit"]
    # a 400 GB/s board, 4 GB per step: 1 / (2 ms + 4/320 s) = 68.966 tok/s
    assert 1 / speed.step_seconds(c, 400 * GB, 4 * GB) == pytest.approx(68.966, rel=1e-3)


def test_t0_and_bandwidth_recovered_from_noisy_rows_with_one_outlier() -> None:
    t0, bw = 5.0, 30.0  # ms, GB/s
    noise = (1.01, 0.99, 1.005, 0.995, 1.0, 1.01)
    pts = [Point(i, "s", "b", 34 * GB, x * GB, (t0 / 1000 + x / bw) * n)
           for i, (x, n) in enumerate(zip((0.5, 1, 2, 3.8, 5, 7.5), noise))]
    pts.append(Point("swap", "s", "b", 34 * GB, 16 * GB, 3 * (t0 / 1000 + 16 / bw)))  # an fp16 8B that swaps
    c = speed_fit.fit_points(pts)
    assert c["outlier_rows"] == ["swap"]
    assert c["t0_ms"] == pytest.approx(t0, abs=0.6)
    assert c["bw_cap_gbps"] == pytest.approx(bw, rel=0.03)


def test_one_size_borrows_t0_and_says_from_where() -> None:
    table = speed_fit.fit_table({"g/rt/w8a8": rows("b", 34, 7, 30, (0.5, 1, 4)),
                                 "g/rt/w4a16": rows("b", 34, 7, 15, (2,))})
    c = table["g/rt/w4a16"]
    assert c["t0_ms"] == pytest.approx(7, abs=1e-3)
    assert "t0 borrowed from g/rt/w8a8" in c["fit"]
    # 2 GB in 7 ms + 2/15 s: the bandwidth term is fitted exactly on that row with the borrowed t0
    assert c["bw_cap_gbps"] == pytest.approx(15, rel=1e-3)


def test_left_out_error_needs_two_sources() -> None:
    by_key = {"g/rt/fp16": rows("b", 100, 1, 50, (1, 2), "p1") + rows("b", 100, 1, 50, (4,), "p2")
              + rows("b", 100, 1, 50, (8,), "p3"),
              "g/rt/w8a8": rows("b", 100, 1, 60, (1, 2), "p1")}
    errs = speed_fit.loso_errors(by_key)
    assert errs["g/rt/fp16"]["error_pct"] == pytest.approx(0, abs=0.1)
    assert errs["g/rt/fp16"]["error_basis"] == "leave-one-source-out, 4 rows from 3 sources"
    assert errs["g/rt/w8a8"]["error_pct"] is None
    assert errs["g/rt/w8a8"]["error_basis"] == "one source: not validated"


def test_a_left_out_source_that_disagrees_shows_in_the_error() -> None:
    # p2 measured 4 GB per step 1.25 × slower than the line p1 and p3 agree on
    good = rows("b", 100, 1, 50, (1, 2), "p1") + rows("b", 100, 1, 50, (8,), "p3")
    slow = Point("slow", "p2", "b", 100 * GB, 4 * GB, 1.25 * (0.001 + 4 / 50))
    by_key = {"g/rt/fp16": [*good, slow]}
    c = speed_fit.fit_table(speed_fit.without(by_key, "p2"))["g/rt/fp16"]
    predicted = 1 / speed.step_seconds(c, 100 * GB, 4 * GB)
    # fitted without p2 the line is exact: 1 / (1 ms + 4/50 s) = 12.346 tok/s against 12.346 / 1.25 measured,
    # 25 % off
    assert predicted == pytest.approx(12.346, rel=1e-3)
    assert abs(predicted * slow.t - 1) * 100 == pytest.approx(25, abs=0.1)
    errs = speed_fit.loso_errors(by_key)["g/rt/fp16"]
    assert errs["error_rows"] == 4 and errs["error_pct"] > 1  # with every source agreeing it is ~0 (above)


TABLE = {"rk3588/rkllm/w8a8": {"t0_ms": 7, "bw_fraction": 0.9, "bw_cap_gbps": 30, "n_rows": 4,
                               "error_pct": 9.0, "error_basis": "leave-one-source-out, 4 rows from 2 sources"},
         "*/rkllm/w4a16": {"t0_ms": 14, "bw_fraction": 0.8, "bw_cap_gbps": 14, "n_rows": 4, "error_pct": 20.0,
                           "error_basis": "leave-one-source-out, 4 rows from 3 sources", "sources": ["a", "b", "c"]},
         "atlas-300i/mindie/fp16": {"t0_ms": 0, "bw_fraction": 0.7, "bw_cap_gbps": 150, "n_rows": 1,
                                    "sources": ["vllm-ascend#1487"]},
         "*/mindie/fp16": {"t0_ms": 0, "bw_fraction": 0.7, "bw_cap_gbps": 150, "n_rows": 1, "error_pct": None,
                           "error_basis": "one source: not validated", "sources": ["vllm-ascend#1487"]}}


def test_an_exact_key_carries_its_own_error_bar() -> None:
    f = speed.lookup(TABLE, "rk3588", "rkllm", "w8a8")
    assert f.consts is TABLE["rk3588/rkllm/w8a8"] and f.error_pct == 9.0
    assert f.basis == "fitted on 4 measured row(s) (rk3588/rkllm/w8a8)"


def test_an_extrapolated_format_is_labelled_and_its_error_bar_widened() -> None:
    other_board = speed.lookup(TABLE, "rk3588", "rkllm", "w4a16")  # the runtime's constants of other groups
    assert "extrapolated from other rkllm boards" in other_board.basis
    assert other_board.error_pct == 40.0  # max(2 × 20 %, 30 %)
    other_format = speed.lookup(TABLE, "rk3588", "rkllm", "w8a8_g")  # same group and runtime, another format
    assert "extrapolated from w8a8" in other_format.basis
    assert other_format.error_pct == 30.0  # max(2 × 9 %, 30 %)
    assert "widened" in other_format.error_basis
    new_generation = speed.lookup(TABLE, "rk3688", "rkllm", "fp16")  # no row of its group, nor of its format
    assert new_generation.consts is TABLE["*/rkllm/w4a16"]
    assert "extrapolated from w4a16 on other rkllm boards" in new_generation.basis
    assert new_generation.error_pct == 40.0  # max(2 × 20 %, 30 %)


def test_a_runtime_with_no_rows_anywhere_gives_no_estimate_and_says_why() -> None:
    f = speed.lookup(TABLE, "ascend-910b", "vllm-ascend", "bf16")
    assert f.consts is None and f.error_pct is None
    assert "no measured rows for vllm-ascend" in f.basis and "edgeinfer calibrate" in f.basis


def test_one_sources_constants_are_not_carried_to_another_generation() -> None:
    # MindIE measured once, on a 310P: a 910B plan gets no estimate rather than the 310P's figure
    for fmt in ("fp16", "bf16"):
        f = speed.lookup(TABLE, "ascend-910b", "mindie", fmt)
        assert f.consts is None and "mindie is measured by one source only, on atlas-300i" in f.basis


def test_plan_text_and_json_show_the_error_bar() -> None:
    c = CONSTS["speed"]["rk3588/rkllm/w8a8"]
    assert c["error_pct"] is not None  # the packaged fit has two sources for this key
    args = ("plan", "phi-3-mini-4k-instruct", "--board", "rk3588-16g", "--quant", "w8a8", "--ctx", "192")
    e = json.loads(cli(*args, "--json").stdout)["estimates"]
    assert e["decode_error_pct"] == c["error_pct"] and e["error_basis"] == c["error_basis"]
    text = cli(*args, env={"COLUMNS": "250"}).stdout
    assert f"±{c['error_pct']:g} % ({c['error_basis']})" in text


def test_plan_json_says_when_there_is_no_error_bar() -> None:
    # iGPU fp16 on the Meteor Lake group: one published table (7-165H) only
    e = json.loads(cli("plan", "phi-3-mini-4k-instruct", "--board", "core-ultra-165h", "--quant", "fp16", "--ctx",
                       "160", "--runtime", "openvino-gpu", "--json").stdout)["estimates"]
    assert e["decode_tokens_per_s"] is not None
    assert e["decode_error_pct"] is None and "not validated" in e["error_basis"]


def _bench(name: str):
    """bench/<name>.py as a module (the scripts put the repository root on sys.path themselves)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_accuracy_predicts_left_out_rows_of_every_rows_file_or_says_why(tmp_path: Path) -> None:
    fit_speed, accuracy = _bench("fit_speed"), _bench("planner_accuracy")
    extra = tmp_path / "rows_synthetic.yaml"
    base = {"grade": "B", "quant": "w8a8", "ctx": 192, "decode": 20.0, "fit": True, "source": "synthetic"}
    extra.write_text(json.dumps({"rows": [
        {**base, "row": 9001, "board": "rk3588-16g", "runtime": "rkllm", "model": "qwen3-0.6b",
         "source_id": "synthetic/a"},
        {**base, "row": 9002, "board": "no-such-board", "runtime": "rkllm", "model": "qwen3-0.6b"},
        {**base, "row": 9003, "board": "rk3588-16g", "runtime": "rkllm", "model": None, "model_name": "Foo-1B"},
        {**base, "row": 9004, "board": "rk3588-16g", "runtime": "mindie", "model": "qwen3-0.6b"}]}))
    rows = fit_speed.load_rows([fit_speed.DATA / "measured_rows.yaml", extra])
    given = {r["row"]: r.get("source_id")
             for r in yaml.safe_load((fit_speed.DATA / "measured_rows.yaml").read_text())["rows"]}
    assert any(given.values()) and not all(given.values())
    # a row without a source_id takes its source; one with a source_id (an RKLLM release) keeps it
    assert all(r["source_id"] == (given[r["row"]] or r["source"]) for r in rows if r["file"] == "measured_rows.yaml")
    recs = {x["row"]: x for x in accuracy.predict_rows(rows)}
    # 9001 is predicted by the constants fitted without its source (the vendor rows)
    assert recs[9001]["decode_after"] > 0 and "rk3588/rkllm/w8a8" in recs[9001]["basis_after"]
    assert "no board profile 'no-such-board'" in recs[9002]["cannot_predict"]
    assert "Foo-1B is not in the catalog" in recs[9003]["cannot_predict"]
    assert "has no runtime mindie" in recs[9004]["cannot_predict"]
    assert recs[9002]["vendor"] == "synthetic"  # no board profile: the rows file names the vendor


def test_sizes_that_do_not_span_2x_borrow_t0_instead_of_fitting_it() -> None:
    # seven 7-8B rows (bytes 3.6-4.3 GB per step) cannot tell a 26 ms fixed cost from the bandwidth term: t0 is
    # borrowed from a key whose rows span sizes, so a 0.3 GB model is not predicted several times too fast
    narrow = rows("npu", 120, 26, 50, (3.6, 3.8, 3.9, 4.0, 4.1, 4.2, 4.3))
    donor = (0.026, "intel-npu3/openvino-npu/w4a16")
    c = speed_fit.fit_points(narrow, donor)
    assert c["t0_ms"] == pytest.approx(26, abs=1e-6) and c["fit"].startswith("t0 borrowed from intel-npu3")
    # 0.3 GB per step: 1 / (26 ms + 0.3/50 s) = 31.25 tok/s
    assert 1 / speed.step_seconds(c, 120 * GB, 0.3 * GB) == pytest.approx(31.25, rel=0.01)
    assert speed_fit.spans([0.3, 4.0]) and not speed_fit.spans([3.6, 4.3])


def test_onnxruntime_decoders_plan_the_quiet_rows_median_overhead_and_encoders_keep_theirs():
    """speed_constants.json's onnxruntime decoder overhead is the median residual (peak − weights − KV −
    activations of the prompt each row ran) of this project's quiet host decoder rows, as bench/fit_speed.py
    measures a residual; a decoder plan takes it, an encoder plan the runtime's own entry."""
    import statistics

    from edgeinfer.planning.planner import plan

    fit_speed = _bench("fit_speed")
    entry = json.loads((fit_speed.ROOT / "edgeinfer" / "data" / "speed_constants.json").read_text())
    entry = entry["overhead_mib"]["onnxruntime"]
    rows = [{**r, "mem_fit": True} for r in fit_speed.load_rows()
            if r.get("runtime") == "onnxruntime" and r.get("board") == "host" and r.get("mem_mib")]
    items = fit_speed.mem_items(rows)["onnxruntime"]
    assert len(items) >= 10
    assert entry["decoder"]["value"] == pytest.approx(statistics.median(i["residual"] for i in items), abs=0.05)
    # each row planned as it ran (its prompt's activations, the KV positions it wrote): every row's plan within 4 %
    # of its peak (31 % when the rows were planned for a prefill of their whole context; 6.2-8.4 % while they were
    # planned with the KV of the context they allocated, whose untouched pages the 210 M rows did not hold; 2.5 %)
    assert max(abs(i["residual"] - entry["decoder"]["value"]) / i["measured"] for i in items) < 0.04
    decoder = plan("qwen3-0.6b", "host", suggest=False).details.runtime
    encoder = plan("all-minilm-l6-v2", "host", batch=32, suggest=False).details.runtime
    assert (decoder.overhead_mib, encoder.overhead_mib) == (entry["decoder"]["value"], entry["value"])


def _partial_host_run(tmp_path, monkeypatch, fp32_now: dict[str, float]):
    """bench/planner_host_llm.py over committed rows fp32 a/b (100 / 50 tok/s) and w4a8 a, its measurements
    faked: fp32 decodes at ``fp32_now``, w4a8 at 80, the copies at 20 / 22 GB/s."""
    import yaml

    bench = _bench("planner_host_llm")
    committed = {("a", "fp32"): 100.0, ("a", "w4a8"): 70.0, ("b", "fp32"): 50.0}
    rows = [{"row": 3000 + i, "quant": q, "model": m, "bandwidth_gbps": 40.0, "decode": d,
             "source_id": f"planner_host_llm/2026-12-02/{m}"} for i, ((m, q), d) in enumerate(committed.items())]
    path = tmp_path / "rows_host.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    monkeypatch.setattr(bench, "ROWS", path)
    monkeypatch.setattr(bench, "MODELS", [("a", None), ("b", None)])
    monkeypatch.setattr(bench, "model_path", lambda shape: tmp_path)
    calls = []

    def measured_row(i, name, model, scheme, source, sid):
        calls.append((name, scheme))
        return {"row": i, "quant": scheme, "model": name, "bandwidth_gbps": {"a": 20.0, "b": 22.0}[name],
                "source_id": sid, "decode": fp32_now[name] if scheme == "fp32" else 80.0}

    monkeypatch.setattr(bench, "measured_row", measured_row)
    return bench, path, calls


def test_planner_host_llm_schemes_replaces_only_the_named_schemes_rows(tmp_path, monkeypatch):
    """``bench/planner_host_llm.py --schemes w4a8`` measures w4a8 (and the reference scheme, to check the machine):
    the other schemes' rows stay as they were, the scheme's old rows go, and the new ones are numbered after the
    last row kept."""
    import yaml

    bench, path, calls = _partial_host_run(tmp_path, monkeypatch, {"a": 109.0, "b": 46.0})  # within 10 %
    out = bench.measure_all(("w4a8",), reference="fp32")
    assert calls == [("a", "fp32"), ("a", "w4a8"), ("b", "fp32"), ("b", "w4a8")]  # each model's reference first
    assert yaml.safe_load(path.read_text())["rows"] == out
    assert [(r["row"], r["model"], r["quant"], r["decode"]) for r in out] == [
        (3000, "a", "fp32", 100.0), (3002, "b", "fp32", 50.0), (3003, "a", "w4a8", 80.0), (3004, "b", "w4a8", 80.0)]
    assert [r["bandwidth_gbps"] for r in out] == [40.0, 40.0, 22.0, 22.0]  # the new run's best copy, its rows only


def test_planner_host_llm_writes_nothing_when_the_reference_scheme_has_moved(tmp_path, monkeypatch):
    """A partial run on a machine slower than the committed rows' day (the reference scheme 40 % off on the first
    model) stops there, exits naming the figures and leaves rows_host.yaml as it was."""
    bench, path, calls = _partial_host_run(tmp_path, monkeypatch, {"a": 60.0, "b": 49.0})
    before = path.read_text()
    with pytest.raises(SystemExit, match=r"nothing written: fp32 .* \(a 60.0 vs 100.0 tok/s\)"):
        bench.measure_all(("w4a8",), reference="fp32")
    assert path.read_text() == before
    assert calls == [("a", "fp32")]


def test_planner_host_llm_keeps_the_reference_rows_when_they_were_asked_for(tmp_path, monkeypatch):
    """``--schemes fp32,w4a8 --reference fp32``: fp32 is measured once per model, checked, and its new rows
    replace the committed ones in the schemes' order."""
    bench, path, calls = _partial_host_run(tmp_path, monkeypatch, {"a": 95.0, "b": 52.0})
    out = bench.measure_all(("fp32", "w4a8"), reference="fp32")
    assert calls == [("a", "fp32"), ("a", "w4a8"), ("b", "fp32"), ("b", "w4a8")]
    assert [(r["row"], r["model"], r["quant"], r["decode"]) for r in out] == [
        (3000, "a", "fp32", 95.0), (3001, "a", "w4a8", 80.0), (3002, "b", "fp32", 52.0), (3003, "b", "w4a8", 80.0)]
