"""Planner vs this machine for decoders: measured and predicted decode tokens/s (``plan --board host``) and
peak RSS, and the rows Part A's fit uses for the host board's speed constants (bench/data/rows_host.yaml).

Models: the committed trained test decoder (tiny-qwen3, ~4 M parameters) and random-init Qwen3s
(``edgeinfer.testing.llm.random_qwen3``) of ~53 M and ~210 M parameters (not the default 3072-wide MLP,
which equals the vocabulary and which the onnxruntime plugin therefore refuses), on onnxruntime — the backend
of ``--board host`` — with one intra-op thread, in each host decoder scheme (fp32, fp16, w8a16, w8a8, w4a16,
w4a8: the plugin's ``convert``, as ``deploy --board host --quant`` builds it).

The machine's memory bandwidth is measured with the host board's own copy benchmark
(edgeinfer.planning.host_bandwidth) just before and just after each model's decode runs (in this process,
so that the child's peak RSS does not count the copy's buffers): the run's figure is the best of
them, recorded in every row and set as ``EDGEINFER_HOST_BANDWIDTH_GBPS``, so every
plan below is ``--board host`` at the bandwidth the rows record. Each measurement runs in a fresh
subprocess (the conversion is done first, in the parent, into the cache): the plugin's decoder over the
converted directory with one thread (what ``edgeinfer.load`` opens for a bundle; glibc's mmap threshold fixed
first, as in serve's decoder workers: ``edgeinfer.serve.child.fixed_mmap_threshold``), then greedy generation of
``NEW_TOKENS`` tokens (EOS ignored) after a ``PROMPT``-token prompt: one warm-up, ``REPEAT`` timed runs,
decode tokens/s = the fastest (like the bandwidth, best of: on a shared machine other processes only slow a run
down; the median and every run are in the row's note). Peak RSS = VmHWM of the child.

Decode is planned at ctx = PROMPT + NEW_TOKENS (the KV the last step reads, as in
bench/data/measured_rows.yaml); memory at CTX, the context the decoder allocates (the planner's working
set: weights + KV + activations + runtime; the host's ``reserved`` share is other processes' memory).
Predicted decode, three ways:

* ``plan_host``: ``plan --board host --quant <scheme>`` as shipped (host-cpu constants of
  edgeinfer/data/speed_constants.json, fitted by bench/fit_speed.py from rows_host.yaml: in-sample once fitted);
* ``fit_all``: the host board calibrated on all rows of this run (``edgeinfer calibrate``'s fit: t0 and a
  fraction of the measured bandwidth), in-sample;
* ``left_out``: the host board calibrated on the other models' rows only (leave one model out), the
  honest figure for a model the constants did not see.

Writes bench/results/planner_host_llm.json and bench/data/rows_host.yaml (row ids 3000-3099, replaced
by each run). ``--schemes w4a8,...`` measures those schemes only and replaces just their rows (a scheme added
later, or one whose kernel changed, without measuring the others again; the new rows numbered after the last).
Such rows are fitted beside rows of another day, so the run measures ``--reference`` (default w8a8) too and writes
nothing, exit 1, unless it decodes within ``--tolerance`` (10 %) of its committed rows on every model.
``--report`` measures nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, onnxruntime_decoder, write  # noqa: E402

MIB = 2**20
CTX, PROMPT, NEW_TOKENS, REPEAT = 1024, 128, 64, 5
ROWS = ROOT / "bench" / "data" / "rows_host.yaml"
FIRST_ROW = 3000
MODELS = [  # (name, random_qwen3 shape or None for the committed test decoder)
    ("tiny-qwen3", None),
    ("random-qwen3-53m", {"layers": 8, "hidden": 768, "heads": 12, "kv_heads": 4, "intermediate": 2048}),
    ("random-qwen3-210m", {"intermediate": 3200}),
]
SCHEMES = ("fp32", "fp16", "w8a16", "w8a8", "w4a16", "w4a8")

CHILD = r"""
import json, statistics, sys
from pathlib import Path
built, hf, (ctx, prompt, new, repeat) = Path(sys.argv[1]), Path(sys.argv[2]), map(int, sys.argv[3:7])
from edgeinfer.serve.child import fixed_mmap_threshold
fixed_mmap_threshold()  # as serve's decoder worker does before it loads anything
from edgeinfer_onnxruntime.decoder import OnnxRuntimeDecoder
# what serve's decoder worker holds besides the decoder (its loop, the bundle reader): a row is that process
import multiprocessing.connection, edgeinfer.model.bundle
import edgeinfer.serve.decoder_worker, edgeinfer.serve.decoder_scheduler
from edgeinfer.run.generation.bench import prompt_of_length
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec
from edgeinfer.contract.generation import GenerationOptions
gen = Generator(OnnxRuntimeDecoder(built, ctx, 1, 1), TextCodec(hf), hf.name)
ids = prompt_of_length(gen.codec, prompt)
opts = GenerationOptions(max_new_tokens=new, ignore_eos=True)
gen.generate_ids(ids, opts)
runs = [gen.generate_ids(ids, opts).metrics for _ in range(repeat)]
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"peak_rss_bytes": int(hwm) * 1024, "kv_cache_bytes": gen.kv_cache_bytes,
                  "decode_tokens_per_s": statistics.median(m.decode_tokens_per_s for m in runs),
                  "decode_tokens_per_s_runs": [m.decode_tokens_per_s for m in runs],
                  "ttft_ms": statistics.median(m.ttft_ms for m in runs)}))
"""


def measure(built: Path, model: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(built), str(model), str(CTX), str(PROMPT), str(NEW_TOKENS),
                        str(REPEAT)], capture_output=True, text=True, timeout=3600, env=env)
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def export(name: str, model: Path, scheme: str) -> Path:
    """The onnxruntime decoder of ``model`` in ``scheme``, built now so that no child counts it (cached across
    runs, keyed by the model's name, the scheme and the plugin's code)."""
    return onnxruntime_decoder("planner_host_llm", name, model, scheme, CTX)


def pct(pred: float | None, meas: float) -> float | None:
    return None if pred is None else round((pred - meas) / meas * 100, 2)


def model_path(shape: dict | None) -> Path:
    from edgeinfer.testing.llm import model_dir, random_qwen3

    return model_dir() if shape is None else random_qwen3(**shape)


def measured_row(i: int, name: str, model: Path, scheme: str, source: str, source_id: str) -> dict:
    """A row of rows_host.yaml, its bandwidth_gbps the copies measured between its decode runs (best of)."""
    from edgeinfer.planning.host_bandwidth import measure_gbps

    built = export(name, model, scheme)
    before = measure_gbps()
    meas = measure(built, model)
    copies = [before, measure_gbps()]
    runs = meas["decode_tokens_per_s_runs"]
    return {"row": i, "grade": "A", "board": "host", "runtime": "onnxruntime", "model": name,
            "model_config": json.loads((model / "config.json").read_text()), "quant": scheme,
            "prompt": PROMPT, "ctx": PROMPT + NEW_TOKENS, "mem_ctx": CTX,
            "decode": round(max(runs), 2), "ttft_ms": round(meas["ttft_ms"], 1),
            "mem_mib": round(meas["peak_rss_bytes"] / MIB, 1), "mem_fit": False,
            "bandwidth_gbps": round(max(copies), 2),
            "fit": True,
            "source": source, "source_id": source_id,
            "note": f"onnxruntime {scheme}, 1 intra-op thread, greedy, {NEW_TOKENS} new tokens after a "
                    f"{PROMPT}-token prompt, best of {REPEAT} runs {[round(x, 2) for x in runs]} (median "
                    f"{round(statistics.median(runs), 2)}); "
                    f"KV allocated for {CTX} tokens: {meas['kv_cache_bytes']} B"}


def calibrated(rows: list[dict], name: str):
    """The host board calibrated on ``rows`` (edgeinfer calibrate's fit; a scheme left with one row is fitted
    on it, however far it moves the estimate: that is the check)."""
    from edgeinfer.planning import calibrate, measurements
    from edgeinfer.planning.boards import host_board

    checked = [measurements.check_row(r, f"rows_host.yaml row {r['row']}") for r in rows]
    board, _, _ = calibrate.calibrate(checked, host_board(), name=name, force=True)
    return board


def predicted(row: dict, board) -> float | None:
    from edgeinfer.planning.models.hf import spec_from_config
    from edgeinfer.planning.planner import plan

    spec = spec_from_config(row["model_config"], row["model"], row["model"])
    return plan(spec, board, quant=row["quant"], ctx=row["ctx"], suggest=False).estimates.decode_tokens_per_s


def allocated_kv(row: dict) -> int:
    """The KV bytes the decoder allocated, as the row's note records them."""
    return int(row["note"].rsplit("KV allocated for", 1)[1].split(":")[1].split()[0])


def report(row: dict, all_fit, left_out) -> dict:
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.models.hf import spec_from_config
    from edgeinfer.planning.planner import plan

    spec = spec_from_config(row["model_config"], row["model"], row["model"])
    shipped = plan(spec, "host", quant=row["quant"], ctx=row["ctx"], suggest=False).estimates
    mem = plan(spec, get_board("host"), quant=row["quant"], ctx=CTX, suggest=False).breakdown
    pred_mem = (mem["weights"] + mem["kv_cache"] + mem["activations"] + mem["runtime"]) / MIB
    dec = row["decode"]
    fit, out = predicted(row, all_fit), predicted(row, left_out)
    return {"model": row["model"], "scheme": row["quant"], "params": spec.params_total,
            "bytes_per_token": shipped.bytes_per_token,
            "decode_tokens_per_s": {
                "measured": dec, "plan_host": shipped.decode_tokens_per_s, "plan_host_basis": shipped.basis,
                "plan_host_pct_error": pct(shipped.decode_tokens_per_s, dec),
                "fit_all": fit, "fit_all_pct_error": pct(fit, dec),
                "left_out": out, "left_out_pct_error": pct(out, dec),
                "roofline_at_bandwidth": round(row["bandwidth_gbps"] * 1e9 / shipped.bytes_per_token, 2)},
            "peak_rss": {"measured_mib": row["mem_mib"], "predicted_mib": round(pred_mem, 1),
                         "pct_error": pct(pred_mem, row["mem_mib"])},
            "kv_cache": {"planned_bytes": mem["kv_cache"], "allocated_bytes": allocated_kv(row),
                         "equal": mem["kv_cache"] == allocated_kv(row)},
            "ttft_ms": row["ttft_ms"]}


def errors(results: list[dict]) -> dict:
    return {k: statistics.median(abs(r["decode_tokens_per_s"][k]) for r in results)
            if results and all(r["decode_tokens_per_s"][k] is not None for r in results) else None
            for k in ("plan_host_pct_error", "fit_all_pct_error", "left_out_pct_error")}


def write_rows(rows: list[dict], when: str) -> None:
    import yaml

    head = (f"# Decode rows measured by this project: bench/planner_host_llm.py, {when} (replaced by each run).\n"
            "# board host = the machine the script ran on, at bandwidth_gbps (its copy benchmark at the time);\n"
            "# host speed constants are fractions of that figure (docs/planner.md#host-decode). Models inline\n"
            "# (model_config) so that the rows plan without their files. ctx = prompt + generated (the KV the\n"
            "# last step reads); mem_mib = peak RSS (VmHWM) of the process with the KV allocated for mem_ctx.\n"
            "# mem_fit: false: a bare decoder process; the onnxruntime overhead is not fitted on it (a served\n"
            "# worker holds more: docs/planner.md#host-decode).\n")
    ROWS.write_text(head + yaml.safe_dump({"rows": rows}, sort_keys=False, width=118))


def main() -> dict:
    """Report on the rows in rows_host.yaml: just measured, or (``--report``) the committed ones after
    bench/fit_speed.py has refitted the constants from them, or after rows were marked ``fit: false``."""
    import yaml

    rows = yaml.safe_load(ROWS.read_text())["rows"]
    results, constants, gbps = [], {}, {}
    for scheme in [s for s in SCHEMES if any(r["quant"] == s for r in rows)]:
        # a scheme's rows come from one run (--schemes measures some again): plans at that run's bandwidth
        mine = [r for r in rows if r["quant"] == scheme]
        gbps[scheme] = max(r["bandwidth_gbps"] for r in mine)
        os.environ["EDGEINFER_HOST_BANDWIDTH_GBPS"] = str(gbps[scheme])  # every plan here: --board host at it
        fitted = [r for r in mine if r.get("fit", True)]  # fit: false rows are predicted, never fitted on
        all_fit = calibrated(fitted, "host-fit-all")
        left_out = {m: calibrated([x for x in fitted if x["model"] != m], f"host-without-{m}")
                    for m in {r["model"] for r in mine}}
        results += [{**report(r, all_fit, left_out[r["model"]]), "fit": r.get("fit", True)} for r in mine]
        speed = all_fit.runtimes["onnxruntime"].speed
        if scheme in speed:
            constants[scheme] = {"t0_ms": speed[scheme].t0_ms, "bw_fraction": speed[scheme].bw_fraction}
    out = {"backend": "onnxruntime (1 intra-op thread)", "host_bandwidth_gbps": gbps,
           "load_average": os.getloadavg(),
           "fit_all_constants": constants,
           "rows": results,
           "median_abs_pct_error": {s: errors([r for r in results if r["scheme"] == s and r["fit"]])
                                    for s in SCHEMES},
           "median_abs_pct_error_peak_rss": statistics.median(abs(r["peak_rss"]["pct_error"]) for r in results)}
    write("planner_host_llm", out)
    return out


def check_reference(committed: list[dict], measured: list[dict], scheme: str, tolerance: float) -> None:
    """Rows of a partial run are fitted beside rows of another day: refuse them unless ``scheme``, measured again
    in this run, decodes within ``tolerance`` of its committed rows on every model (the machine as fast as it was
    then; its copy benchmark alone does not tell: a shared machine can copy as fast and compute at half speed)."""
    old = {r["model"]: r["decode"] for r in committed if r["quant"] == scheme}
    if not old:
        raise SystemExit(f"--reference {scheme}: no committed rows of that scheme to compare with")
    off = [f"{r['model']} {r['decode']} vs {old[r['model']]}" for r in measured
           if r["quant"] == scheme and r["model"] in old and abs(r["decode"] / old[r["model"]] - 1) > tolerance]
    if off:
        raise SystemExit(f"nothing written: {scheme} decodes more than {tolerance:.0%} away from its committed rows "
                         f"in this run ({'; '.join(off)} tok/s), so this machine is not as it was when they were "
                         f"measured; run again when it is quiet, or measure every scheme")


def measure_all(schemes: tuple[str, ...] = SCHEMES, reference: str | None = "w8a8",
                tolerance: float = 0.10) -> list[dict]:
    """Measure ``schemes`` and write their rows. A partial run keeps the other schemes' rows and first checks
    the machine against them (:func:`check_reference`) by measuring ``reference`` too (``None``: no check)."""
    import yaml

    when = time.strftime("%Y-%m-%d", time.gmtime())
    source = f"bench/planner_host_llm.py on this project's {os.cpu_count()}-core CI machine, {when}"
    partial = set(schemes) != set(SCHEMES)
    committed = yaml.safe_load(ROWS.read_text())["rows"] if partial else []
    kept = [r for r in committed if r["quant"] not in schemes]
    first = max((r["row"] + 1 for r in kept), default=FIRST_ROW)
    check = reference if partial else None
    rows = []
    # one source per model: the rows of one run differ by model, and leaving one model out is the check that
    # matters for a host (docs/planner.md#host-decode); a model's reference row first, so a moved machine stops it
    for name, shape in MODELS:
        model = model_path(shape)
        if check:
            ref = measured_row(0, name, model, check, source, f"planner_host_llm/{when}/{name}")
            check_reference(committed, [ref], check, tolerance)
            rows += [ref] if check in schemes else []
        rows += [measured_row(0, name, model, scheme, source, f"planner_host_llm/{when}/{name}")
                 for scheme in schemes if scheme != check]
    names = [name for name, _ in MODELS]
    rows.sort(key=lambda r: (names.index(r["model"]), schemes.index(r["quant"])))
    for i, r in enumerate(rows):
        r["row"] = first + i
    gbps = max(r["bandwidth_gbps"] for r in rows)  # the run's best copy: one board for all its rows
    for r in rows:
        r["bandwidth_gbps"] = gbps
    dates = sorted({r["source_id"].split("/")[1] for r in kept} | {when})
    write_rows(kept + rows, ", ".join(dates))
    return kept + rows


if __name__ == "__main__":
    ap = arguments(__doc__)
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="measure these schemes only, replacing just their "
                    f"rows (comma-separated, some of {','.join(SCHEMES)})")
    ap.add_argument("--reference", default="w8a8", help="with --schemes: a scheme whose code has not changed since "
                    "its rows, measured again and compared with them before anything is written ('none': no check)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="how far the reference may decode from its "
                    "committed rows (a fraction; default 0.10)")
    ap.add_argument("--report", action="store_true", help="measure nothing: report on the committed rows")
    args = ap.parse_args()
    picked = tuple(args.schemes.split(","))
    if set(picked) - set(SCHEMES):
        ap.error(f"--schemes takes some of {','.join(SCHEMES)}, got {args.schemes}")
    if args.reference != "none" and args.reference not in SCHEMES:
        ap.error(f"--reference takes one of {','.join(SCHEMES)} or none, got {args.reference}")
    reference = None if args.reference == "none" else args.reference
    if not args.report:
        measure_all(picked, reference, args.tolerance)
    res = main()
    print(f"host bandwidth (copy benchmark, 1 thread): {res['host_bandwidth_gbps']} GB/s; load "
          f"{[round(x, 2) for x in res['load_average']]}; fit on all rows: {res['fit_all_constants']}")
    for r in res["rows"]:
        d, m = r["decode_tokens_per_s"], r["peak_rss"]
        print(f"{r['model']} {r['scheme']} ({r['params'] / 1e6:.1f} M params): decode {d['measured']} tok/s; "
              f"plan --board host {d['plan_host']} ({d['plan_host_basis']}); fit on all {d['fit_all']} "
              f"({d['fit_all_pct_error']}%); "
              f"left out {d['left_out']} ({d['left_out_pct_error']}%); peak RSS {m['measured_mib']} MiB vs "
              f"{m['predicted_mib']} MiB ({m['pct_error']}%)")
