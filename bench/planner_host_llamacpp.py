"""Planner vs this machine for the llama.cpp host runtime (the ``llamacpp`` backend): measured decode tokens/s and
what ``plan --board host --runtime llama.cpp`` predicts, and the rows bench/fit_speed.py fits the host-cpu
llama.cpp constants on (bench/data/rows_host_llamacpp.yaml, row ids 3100-3199, replaced by each run).

The method of bench/planner_host_llm.py (its models, prompt, context and bandwidth rule), on llama.cpp: the
plugin's conversion (llama.cpp's converter, ``llama_model_quantize``; cached), each measurement in a fresh
subprocess with one thread (``threads=1``: what deploy's golden check uses for a small model), greedy, EOS
ignored, one warm-up then ``REPEAT`` runs, decode tok/s = the fastest. Predicted three ways, as there:
``plan_host`` (the shipped constants), ``fit_all`` (the host board calibrated on these rows, in-sample) and
``left_out`` (calibrated without the row's model).

    python bench/planner_host_llamacpp.py [--report]      # --report: the committed rows, no measuring

Writes bench/results/planner_host_llamacpp.json and bench/data/rows_host_llamacpp.yaml.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import planner_host_llm as base  # noqa: E402
from _common import arguments, write  # noqa: E402

ROWS = base.ROOT / "bench" / "data" / "rows_host_llamacpp.yaml"
FIRST_ROW = 3100
RUNTIME = "llama.cpp"
SCHEMES = ("fp32", "fp16", "gguf:Q8_0", "gguf:Q4_0")

CHILD = r"""
import json, statistics, sys
from pathlib import Path
artifact, hf, backend = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[7]
ctx, prompt, new, repeat = map(int, sys.argv[3:7])
import edgeinfer
from edgeinfer.run.generation.bench import prompt_of_length
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.contract.generation import GenerationOptions
dec = edgeinfer.backend(backend).load_decoder(artifact, device=None, context=ctx, threads=1)
gen = Generator(dec, TextCodec(hf), hf.name)
ids = prompt_of_length(gen.codec, prompt)
opts = GenerationOptions(max_new_tokens=new, ignore_eos=True)
gen.generate_ids(ids, opts)
# each run's prompt rotated: a runtime that keeps the KV of a prefix it has seen (GenAI) would prefill almost nothing
runs = [gen.generate_ids(ids[i + 1:] + ids[:i + 1], opts).metrics for i in range(repeat)]
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"peak_rss_bytes": int(hwm) * 1024, "kv_cache_bytes": gen.kv_cache_bytes, "device": dec.device,
                  "kv_dtype": dec.kv_dtype, "decode_tokens_per_s_runs": [m.decode_tokens_per_s for m in runs],
                  "ttft_ms": statistics.median(m.ttft_ms for m in runs)}))
"""


def measure(artifact: Path, model: Path, backend: str = "llamacpp") -> dict:
    """One fresh process: ``backend``'s decoder over ``artifact`` with one thread, the prompt, the timed runs."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(artifact), str(model), str(base.CTX), str(base.PROMPT),
                        str(base.NEW_TOKENS), str(base.REPEAT), backend], capture_output=True, text=True,
                       timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def timed_row(row: int, runtime: str, backend: str, artifact: Path, name: str, model: Path, scheme: str,
              source: str, source_id: str, mem_ctx: int, note: Callable[[dict, list[float]], str]) -> dict:
    """A row of ``runtime``: ``backend``'s decoder over ``artifact`` (already converted, so that no child counts
    it), its bandwidth the copies measured around the decode runs (best of); ``note(measured, runs)`` describes
    the run. Shared with bench/planner_host_openvino.py."""
    from edgeinfer.planning.host_bandwidth import measure_gbps

    before = measure_gbps()
    meas = measure(artifact, model, backend)
    copies = [before, measure_gbps()]
    runs = meas["decode_tokens_per_s_runs"]
    return {"row": row, "grade": "A", "board": "host", "runtime": runtime, "model": name,
            "model_config": json.loads((model / "config.json").read_text()), "quant": scheme,
            "prompt": base.PROMPT, "ctx": base.PROMPT + base.NEW_TOKENS, "mem_ctx": mem_ctx,
            "decode": round(max(runs), 2), "ttft_ms": round(meas["ttft_ms"], 1),
            "mem_mib": round(meas["peak_rss_bytes"] / base.MIB, 1), "bandwidth_gbps": round(max(copies), 2),
            "fit": True, "source": source, "source_id": source_id, "note": note(meas, runs)}


def best_of(runs: list[float]) -> str:
    return (f"best of {base.REPEAT} runs {[round(x, 2) for x in runs]} (median "
            f"{round(statistics.median(runs), 2)})")


def measured_row(i: int, name: str, model: Path, scheme: str, source: str, source_id: str) -> dict:
    from edgeinfer_llamacpp.convert import cached_scheme

    def note(meas: dict, runs: list[float]) -> str:
        return (f"llama.cpp (llama-cpp-python) {scheme}, 1 thread, greedy, {base.NEW_TOKENS} new tokens after a "
                f"{base.PROMPT}-token prompt, {best_of(runs)}; KV allocated for {base.CTX} tokens: "
                f"{meas['kv_cache_bytes']} B")

    return timed_row(FIRST_ROW + i, RUNTIME, "llamacpp", cached_scheme(model, scheme), name, model, scheme, source,
                     source_id, base.CTX, note)


def predicted(row: dict, board) -> float | None:
    from edgeinfer.planning.models.hf import spec_from_config
    from edgeinfer.planning.planner import plan

    spec = spec_from_config(row["model_config"], row["model"], row["model"])
    return plan(spec, board, quant=row["quant"], ctx=row["ctx"], runtime=row["runtime"],
                suggest=False).estimates.decode_tokens_per_s


def report(row: dict, all_fit, left_out) -> dict:
    from edgeinfer.planning.boards import get_board

    dec, shipped = row["decode"], predicted(row, get_board("host"))
    fit, out = predicted(row, all_fit), predicted(row, left_out)
    return {"model": row["model"], "scheme": row["quant"], "decode_tokens_per_s": {
        "measured": dec, "plan_host": shipped, "plan_host_pct_error": base.pct(shipped, dec),
        "fit_all": fit, "fit_all_pct_error": base.pct(fit, dec), "left_out": out,
        "left_out_pct_error": base.pct(out, dec)}}


def run(name: str, rows_path: Path, measured: Callable[..., dict], schemes: tuple[str, ...], backend: str,
        measure_rows: bool) -> dict:
    """Measure ``base.MODELS`` × ``schemes`` (``measured(i, name, model, scheme, source, source_id)`` per row) into
    ``rows_path`` (or read it), plan every row three ways, write bench/results/NAME.json. Shared with
    bench/planner_host_openvino.py."""
    import yaml

    if measure_rows:
        when = time.strftime("%Y-%m-%d", time.gmtime())
        source = f"bench/{name}.py on this project's {os.cpu_count()}-core CI machine, {when}"
        runs = [(model, base.model_path(shape), s) for model, shape in base.MODELS for s in schemes]
        rows = [measured(i, model, path, s, source, f"{name}/{when}/{model}")
                for i, (model, path, s) in enumerate(runs)]
        gbps = max(r["bandwidth_gbps"] for r in rows)
        for r in rows:
            r["bandwidth_gbps"] = gbps
        head = (f"# Decode rows of {backend} on the host: bench/{name}.py, {when} (replaced by each run).\n# As "
                "rows_host.yaml (bench/planner_host_llm.py): board host at bandwidth_gbps, models inline.\n")
        rows_path.write_text(head + yaml.safe_dump({"rows": rows}, sort_keys=False, width=118))
    else:
        rows = yaml.safe_load(rows_path.read_text())["rows"]
    gbps = max(r["bandwidth_gbps"] for r in rows)
    os.environ["EDGEINFER_HOST_BANDWIDTH_GBPS"] = str(gbps)
    all_fit = base.calibrated(rows, "host-fit-all")
    left_out = {m: base.calibrated([x for x in rows if x["model"] != m], f"host-without-{m}")
                for m in {r["model"] for r in rows}}
    results = [report(r, all_fit, left_out[r["model"]]) for r in rows]
    out = {"backend": backend, "host_bandwidth_gbps": gbps, "load_average": os.getloadavg(), "rows": results,
           "median_abs_pct_error": base.errors(results)}
    write(name, out)
    return out


def print_report(res: dict) -> None:
    print(f"host bandwidth {res['host_bandwidth_gbps']} GB/s; load {[round(x, 2) for x in res['load_average']]}; "
          f"median |error| {res['median_abs_pct_error']}")
    for r in res["rows"]:
        d = r["decode_tokens_per_s"]
        print(f"{r['model']} {r['scheme']}: measured {d['measured']} tok/s; plan --board host {d['plan_host']} "
              f"({d['plan_host_pct_error']}%); fit on all {d['fit_all']} ({d['fit_all_pct_error']}%); left out "
              f"{d['left_out']} ({d['left_out_pct_error']}%)")


if __name__ == "__main__":
    ap = arguments(__doc__)
    ap.add_argument("--report", action="store_true", help="measure nothing: report on the committed rows")
    print_report(run("planner_host_llamacpp", ROWS, measured_row, SCHEMES, "llamacpp (llama-cpp-python, 1 thread)",
                     measure_rows=not ap.parse_args().report))
