"""Fit the speed-model constants on the measured rows of bench/data/measured_rows.yaml.

Decode: time_per_token = t0 + bytes_per_token / BW_eff, per (speed group, runtime, weight format),
by least squares on the *relative* error (each row weighted by 1/measured time).
  >= 2 rows with different sizes: fit t0 and BW_eff (t0 clamped at 0).
  1 row: t0 borrowed from another format of the same group/runtime (else 0), BW_eff exact.
BW_eff is stored as a fraction of the board's physical bandwidth so it transfers across boards.
Prefill: factor = measured prefill tok/s × 2 × active params / peak ops (median per group).
Runtime memory overhead (rkllm): median of measured peak RSS − (weights + KV + activations).

Writes edgeinfer/data/speed_constants.json (read by the planner) and bench/results/fit_speed.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from edgeinfer.contract.schemes import normalize_scheme  # noqa: E402
from edgeinfer.planning import calibrate, planner  # noqa: E402
from edgeinfer.planning.boards import get_board  # noqa: E402
from edgeinfer.planning.models import resolve  # noqa: E402

OUT = ROOT / "edgeinfer" / "data" / "speed_constants.json"
MIB = 2**20


def load_rows() -> list[dict]:
    data = yaml.safe_load((ROOT / "bench" / "data" / "measured_rows.yaml").read_text())
    return data["rows"]


def row_facts(r: dict) -> dict:
    """Bytes per token, params, board facts for one row (from the planner's own formulas)."""
    spec = resolve(r["model"])
    board = get_board(r["board"])
    scheme = normalize_scheme(r["quant"])
    prof = planner.runtime_profile(r["runtime"])
    kv_b = 2.0
    stream = planner.decode_stream_bytes(spec, scheme, prof)
    kv = planner.kv_bytes(spec, r["ctx"], 1, kv_b)
    rt = board.runtimes[r["runtime"]]
    return {"spec": spec, "board": board, "scheme": scheme, "prof": prof, "bytes": stream + kv,
            "group": f"{rt.speed_group}/{r['runtime']}/{planner.format_key(scheme)}"}


def fit_group(xs: list[float], ts: list[float], t0_fixed: float | None = None) -> tuple[float, float]:
    """Weighted LS for t = t0 + x / bw, weights 1/t (relative error): ``edgeinfer calibrate``'s own fit."""
    return calibrate.fit_line(xs, ts, t0_fixed)


def main() -> dict:
    rows = [r for r in load_rows() if r.get("model") and r.get("fit")]
    groups: dict[str, list] = {}
    for r in rows:
        f = row_facts(r)
        groups.setdefault(f["group"], []).append((r, f))
    speed: dict[str, dict] = {}
    # multi-row groups first, so single-row groups can borrow t0
    for key in sorted(groups, key=lambda k: -len(groups[k])):
        items = groups[key]
        xs = [f["bytes"] for _, f in items]
        ts = [1.0 / r["decode"] for r, _ in items]
        prefix = key.rsplit("/", 1)[0] + "/"
        t0_fixed = None
        if len(items) == 1 or len(set(xs)) < 2:
            donors = [v["t0_ms"] / 1000 for k, v in speed.items() if k.startswith(prefix)]
            t0_fixed = statistics.median(donors) if donors else 0.0
        t0, bw = fit_group(xs, ts, t0_fixed)
        board_bw = items[0][1]["board"].bandwidth_gbps.value * 1e9
        errs = []
        for (r, f), x, t in zip(items, xs, ts):
            pred = 1.0 / (t0 + x / bw)
            errs.append(abs(pred - r["decode"]) / r["decode"] * 100)
        pfs = []
        for r, f in items:
            pre = r.get("prefill") or (
                r["prompt"] / (r["ttft_ms"] / 1000) if r.get("ttft_ms") and r.get("prompt") else None)
            b = f["board"]
            peak = b.int8_tops.value * 1e12 if b.int8_tops else (
                b.fp16_tflops.value * 1e12 if b.fp16_tflops else None)
            if pre and peak:
                pfs.append(pre * 2 * f["spec"].params_active / peak)
        speed[key] = {
            "t0_ms": round(t0 * 1000, 3), "bw_fraction": round(bw / board_bw, 4),
            "bw_eff_gbps": round(bw / 1e9, 2), "fit_board": items[0][0]["board"],
            "prefill_factor": round(statistics.median(pfs), 5) if pfs else None,
            "n_rows": len(items), "rows": [r["row"] for r, _ in items],
            "fit": "t0 and BW_eff" if t0_fixed is None else (
                f"BW_eff only (t0 {'borrowed' if t0_fixed else 'fixed at 0'}); exact on 1 row, no validation"
                if len(items) == 1 else "BW_eff only"),
            "fit_abs_pct_error": [round(e, 2) for e in errs],
            "fit_median_abs_pct_error": round(statistics.median(errs), 2),
            "source": "bench/fit_speed.py on bench/data/measured_rows.yaml (docs/board-facts.md#speed-model)",
        }
    # rkllm memory overhead: measured peak RSS minus planned weights + KV + activations
    residuals = []
    for r in rows:
        if r["runtime"] != "rkllm" or not r.get("mem_mib") or r.get("grade") != "A":
            continue
        f = row_facts(r)
        w, _ = planner.weights_bytes(f["spec"], f["scheme"], f["prof"])
        kv = planner.kv_bytes(f["spec"], r["ctx"], 1, 2.0)
        act, _ = planner.activation_bytes(f["spec"], r["ctx"], 1, f["prof"])
        residuals.append((r["row"], (r["mem_mib"] * MIB - w - kv - act) / MIB))
    ov = {}
    if residuals:
        med = statistics.median(v for _, v in residuals)
        ov["rkllm"] = {"value": round(max(med, 0.0), 1),
                       "source": "bench/fit_speed.py: median of (RKLLM peak RSS − weights − KV − activations) over "
                                 f"vendor rows {[r for r, _ in residuals]} of bench/data/measured_rows.yaml "
                                 "(docs/board-facts.md#rkllm-memory)",
                       "residuals_mib": {str(k): round(v, 1) for k, v in residuals}}
    prev = json.loads(OUT.read_text()) if OUT.is_file() else {}
    result = {"schema": "edgeinfer.speed_constants/1", "speed": speed,
              "overhead_mib": {**prev.get("overhead_mib", {}), **ov}}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "fit_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    res = main()
    print(f"{'group':42s} {'rows':>8s} {'t0 ms':>7s} {'BW_eff':>8s} {'frac':>6s} {'prefill':>8s}  median|err|%")
    for k, v in res["speed"].items():
        pf = f"{v['prefill_factor']:.4f}" if v["prefill_factor"] else "-"
        print(f"{k:42s} {str(v['rows']):>8s} {v['t0_ms']:7.2f} {v['bw_eff_gbps']:8.1f} {v['bw_fraction']:6.3f} "
              f"{pf:>8s}  "
              f"{v['fit_median_abs_pct_error']:.1f}  ({v['fit']})")
    for k, v in res["overhead_mib"].items():
        print(f"overhead {k}: {v['value']} MiB  residuals {v.get('residuals_mib')}")
