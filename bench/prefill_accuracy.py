"""How well the planner's prefill model predicts published times to the first token, against the model it replaced.

Rows: every fit row of bench/data (fit_speed.load_rows) with a prompt and a TTFT (or a prefill rate), on a board
with a peak compute figure. Per speed key (``group/runtime/format``, as bench/fit_speed.py fits them):

* ``t0``: the planner's model (edgeinfer/planning/prefill.py): TTFT = t0 + prompt × 2 × params / (factor × peak),
  t0 fitted where the key's prompts span 4×, else borrowed;
* ``rate``: the model before it: t0 = 0, factor = the median of the rows' (prompt / TTFT × 2 × params / peak).

For each: the in-sample median |error| of the TTFT and the leave-one-source-out one (each source's rows predicted
by the constants fitted without it, as bench/fit_speed.py's error bars). Beside them, per pair of rows of one
model on one board at a 31-33- and a 1023-1025-token prompt, the measured TTFT ratio and the plan's.

    python bench/prefill_accuracy.py [--out NAME]

Writes bench/results/prefill_accuracy.json; nothing is measured here.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_speed  # noqa: E402
from _common import arguments, write  # noqa: E402

from edgeinfer.planning import planner, prefill, speed_fit  # noqa: E402


def rate_errors(ms: list[prefill.Measured], train: list[prefill.Measured]) -> list[float]:
    """|error| % of ``ms`` under the t0-free model fitted on ``train``."""
    c = {"prefill_factor": statistics.median(m.prompt * m.s_per_token / m.ttft_s for m in train)}
    return prefill.errors(c, ms)


def per_key(by_key: dict[str, list[speed_fit.Point]]) -> dict[str, dict]:
    table, left_out = speed_fit.fit_table(by_key), speed_fit.loso_errors(by_key)
    out = {}
    for k, pts in speed_fit.with_stars(by_key).items():
        ms = [p.prefill for p in pts if p.prefill]
        if not ms:
            continue
        loso_rate = []
        for s in {p.source for p in pts if p.prefill}:
            train = [p.prefill for p in pts if p.prefill and p.source != s]
            if train:
                loso_rate += rate_errors([p.prefill for p in pts if p.prefill and p.source == s], train)
        out[k] = {"rows": len(ms), "prompts": sorted({m.prompt for m in ms}),
                  "sources": len({p.source for p in pts if p.prefill}),
                  "t0_ms": table[k]["prefill_t0_ms"], "factor": table[k]["prefill_factor"],
                  "fit": table[k]["prefill_fit"],
                  "in_sample_pct": {"t0": table[k]["prefill_fit_median_abs_pct_error"],
                                    "rate": round(statistics.median(rate_errors(ms, ms)), 1)},
                  "left_out_pct": {"t0": left_out[k]["prefill_error_pct"],
                                   "rate": round(statistics.median(loso_rate), 1) if loso_rate and
                                   left_out[k]["prefill_error_pct"] is not None else None}}
    return out


def pairs(rows: list[dict]) -> list[dict]:
    fits = [r for r in rows if r.get("fit") and r.get("ttft_ms") and r.get("prompt")]
    same = ("board", "runtime", "model", "quant")
    out = []
    for s in (r for r in fits if r["prompt"] in (31, 32, 33)):
        long = next((r for r in fits if all(r[k] == s[k] for k in same) and r["prompt"] in (1023, 1024, 1025)), None)
        if long is None:
            continue
        ms = [planner.plan(r["model"], r["board"], quant=r["quant"], runtime=r["runtime"], ctx=2048,
                           prompt=r["prompt"], suggest=False).estimates.ttft_ms()[0]["ms"] for r in (s, long)]
        out.append({**{k: s[k] for k in same}, "rows": [s["row"], long["row"]],
                    "measured_ms": [s["ttft_ms"], long["ttft_ms"]], "planned_ms": ms,
                    "measured_ratio": round(long["ttft_ms"] / s["ttft_ms"], 2),
                    "planned_ratio": round(ms[1] / ms[0], 2)})
    return out


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--out", default="prefill_accuracy", help="result name (bench/results/NAME.json)")
    args = ap.parse_args()
    rows = fit_speed.load_rows()
    by_key, _ = fit_speed.points(rows)
    keys = per_key(by_key)
    ps = pairs(rows)
    within = sum(1 for p in ps if 0.5 < p["planned_ratio"] / p["measured_ratio"] < 2)
    summary = {k: round(statistics.median(v["left_out_pct"][k] for v in keys.values()
                                          if not v["fit"].startswith("t0 0") and v["left_out_pct"]["t0"] is not None),
                        1) for k in ("t0", "rate")}
    result = {"keys": keys, "pairs": ps,
              "summary": {"keys_with_a_fitted_or_borrowed_t0_median_left_out_pct": summary,
                          "pairs": len(ps), "pairs_within_2x_of_the_measured_ratio": within}}
    path = write(args.out, result)
    for k, v in keys.items():
        print(f"{k:42s} rows {v['rows']:3d} t0 {v['t0_ms']:7.1f} ms  in-sample {v['in_sample_pct']['t0']:5.1f} % "
              f"(rate {v['in_sample_pct']['rate']:5.1f})  left out {v['left_out_pct']['t0']} % "
              f"(rate {v['left_out_pct']['rate']})")
    print(f"pairs 32 -> 1024 tokens: {within} of {len(ps)} planned within 2x of the measured ratio")
    print(f"median left-out error of the keys with a t0: {summary} -> {path}")


if __name__ == "__main__":
    main()
