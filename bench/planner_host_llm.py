"""Planner vs this machine for decoders: predicted and measured peak RSS, KV cache and decode tokens/s.

Models: the committed trained test decoder (tiny-qwen3, ~4 M parameters) and a random-init Qwen3 of
~210 M parameters (``edgeinfer.testing.llm.random_qwen3(intermediate=3200)``, ~840 MB fp32; not the default
3072-wide MLP, which equals the vocabulary and which the onnxruntime plugin therefore refuses), both fp32 on
onnxruntime —
the backend of ``--board host`` — with one intra-op thread, context ``CTX``.

Each measurement runs in a fresh subprocess (the ONNX export is done first, in the parent's cache):
``edgeinfer.load(model, backend="onnxruntime", ctx=CTX, threads=1)``, then greedy generation of
``NEW_TOKENS`` tokens (EOS ignored) after a ``PROMPT``-token prompt: one warm-up, ``REPEAT`` timed
runs, decode tokens/s = the median. Peak RSS = VmHWM of the child.

The planner's working set is weights + KV + activations + runtime (the host's ``reserved`` share is
other processes' memory, not part of the child's RSS); its KV figure is compared with the decoder's
allocation. ``--board host`` claims no memory bandwidth, so the planner gives no decode estimate
there. This script also measures a STREAM-like bandwidth (NumPy copy of a 256 MiB array, one thread,
best of 5, read + write bytes) and plans again with a board file that is the host plus that bandwidth
and pure-roofline constants (t0 = 0, bw_fraction = 1: no fitted constants exist for this machine),
so the decode figure there is the roofline bound bytes_per_token / bandwidth, not a fitted estimate.

Writes bench/results/planner_host_llm.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write  # noqa: E402

MIB = 2**20
CTX, PROMPT, NEW_TOKENS, REPEAT = 1024, 128, 64, 3

CHILD = r"""
import json, statistics, sys
path, ctx, prompt, new, repeat = sys.argv[1], *map(int, sys.argv[2:6])
import edgeinfer
from edgeinfer.run.generation.bench import prompt_of_length
from edgeinfer.contract.generation import GenerationOptions
gen = edgeinfer.load(path, backend="onnxruntime", ctx=ctx, threads=1)
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


def stream_copy_gbps(mib: int = 256, tries: int = 5) -> float:
    """Best-of-``tries`` NumPy copy bandwidth in GB/s (bytes read + bytes written), one thread."""
    import numpy as np

    a = np.ones(mib * MIB // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best / 1e9


def measured_board(gbps: float, out: Path) -> Path:
    """The host board with the measured bandwidth and pure-roofline constants, as a board file."""
    import yaml

    from edgeinfer.planning.boards import HOST_BACKEND, host_board

    d = host_board().model_dump(mode="json", exclude_none=True)
    d.pop("origin", None)
    d["name"] = "host-measured-bw"
    d["notes"] = ["the host with a measured STREAM-like bandwidth and pure-roofline speed constants"]
    d["bandwidth_gbps"] = {"value": round(gbps, 2),
                           "source": "measured by bench/planner_host_llm.py: NumPy copy, one thread, best of 5"}
    d["runtimes"][HOST_BACKEND]["speed"] = {"fp32": {
        "t0_ms": 0.0, "bw_fraction": 1.0,
        "source": "pure roofline (no fitted constants for this machine): decode = bandwidth / bytes per token"}}
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


def measure(model: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(model), str(CTX), str(PROMPT), str(NEW_TOKENS),
                        str(REPEAT)], capture_output=True, text=True, timeout=3600, env=env)
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def export(model: Path) -> None:
    """Build the onnxruntime decoder now, so no child counts the export."""
    from edgeinfer_onnxruntime.decoder import build

    from edgeinfer.contract import cache

    build(model, cache.area("artifacts"), "fp32")


def pct(pred: float | None, meas: float) -> float | None:
    return None if pred is None else round(abs(pred - meas) / meas * 100, 2)


def _roofline_at_run(est: dict) -> float | None:
    if not est.get("bandwidth_gbps"):
        return None
    kv = est["kv_bytes_per_token_at_ctx"] * (PROMPT + NEW_TOKENS / 2) / CTX
    return round(est["bandwidth_gbps"] * 1e9 / (est["weight_bytes_per_token"] + kv), 2)


def row(name: str, model: Path, board_file: Path) -> dict:
    from edgeinfer.planning.planner import plan

    export(model)
    meas = measure(model)
    p = plan(str(model), "host", quant="fp32", ctx=CTX, suggest=False)
    bd = p.breakdown
    pred = bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]
    roof = plan(str(model), str(board_file), quant="fp32", ctx=CTX, suggest=False).estimates.to_dict()
    rate = meas["decode_tokens_per_s"]
    return {
        "model": name, "params": p.model.params_total, "ctx": CTX, "prompt_tokens": PROMPT, "new_tokens": NEW_TOKENS,
        "kv_cache": {"planned_bytes": bd["kv_cache"], "allocated_bytes": meas["kv_cache_bytes"],
                     "equal": bd["kv_cache"] == meas["kv_cache_bytes"]},
        "peak_rss": {"measured_mib": round(meas["peak_rss_bytes"] / MIB, 1), "predicted_mib": round(pred / MIB, 1),
                     "abs_pct_error": pct(pred, meas["peak_rss_bytes"]),
                     "predicted_breakdown_mib": {k: round(v / MIB, 1) for k, v in bd.items() if k != "reserved"}},
        "decode_tokens_per_s": {
            "measured": round(rate, 2), "measured_runs": [round(x, 2) for x in meas["decode_tokens_per_s_runs"]],
            "planner_host": p.estimates.decode_tokens_per_s,
            "planner_host_basis": p.estimates.basis or "no estimate",
            "roofline_measured_bw": roof["decode_tokens_per_s"],
            "roofline_abs_pct_error": pct(roof["decode_tokens_per_s"], rate),
            "measured_fraction_of_roofline": (round(rate / roof["decode_tokens_per_s"], 3)
                                              if roof["decode_tokens_per_s"] else None),
            "bytes_per_token": roof["bytes_per_token"],
            # the planner assumes each step reads the KV of the whole context; the run decodes at
            # positions PROMPT..PROMPT+NEW_TOKENS, whose mean KV read is this much smaller
            "roofline_at_run_positions": _roofline_at_run(roof),
        },
        "ttft_ms": round(meas["ttft_ms"], 1),
    }


def main() -> dict:
    from edgeinfer.testing.llm import model_dir, random_qwen3

    gbps = stream_copy_gbps()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-hostllm-") as tmp:
        board = measured_board(gbps, Path(tmp) / "host-measured-bw.yaml")
        rows = [row("tiny-qwen3 (trained test model)", model_dir(), board),
                row("random-init Qwen3 (edgeinfer.testing.llm.random_qwen3, intermediate 3200)",
                    random_qwen3(intermediate=3200), board)]
    out = {"backend": "onnxruntime (fp32, 1 intra-op thread)", "stream_copy_gbps": round(gbps, 2),
           "load_average": os.getloadavg(), "rows": rows,
           "median_abs_pct_error_peak_rss": statistics.median(r["peak_rss"]["abs_pct_error"] for r in rows)}
    write("planner_host_llm", out)
    return out


if __name__ == "__main__":
    res = main()
    print(f"STREAM-like copy bandwidth (1 thread): {res['stream_copy_gbps']} GB/s; load {res['load_average']}")
    for r in res["rows"]:
        kv, rss, dec = r["kv_cache"], r["peak_rss"], r["decode_tokens_per_s"]
        print(f"{r['model']}: KV planned {kv['planned_bytes']} B, allocated {kv['allocated_bytes']} B "
              f"(equal: {kv['equal']}); peak RSS measured {rss['measured_mib']} MiB, predicted "
              f"{rss['predicted_mib']} MiB, |err| {rss['abs_pct_error']}% {rss['predicted_breakdown_mib']}; "
              f"decode measured {dec['measured']} tok/s, planner (host) {dec['planner_host_basis']}, roofline at "
              f"the measured bandwidth {dec['roofline_measured_bw']} tok/s ({dec['measured_fraction_of_roofline']} "
              f"of it)")
