"""Planner accuracy on every measured row of bench/data/measured_rows.yaml.

For each row: predicted decode tok/s (and memory where the source reports one) vs measured,
absolute % error; medians per runtime, for the Rockchip vendor (grade A) rows, and leave-one-out
errors for groups fitted on >= 3 rows (the fair figure: the row is not in its own fit).
Calibration (`edgeinfer calibrate`, edgeinfer/planning/calibrate.py), leave-one-out: per group of
rows from one board and one kind of source (grade A = vendor tables, grades B-D = the rest), each row is
predicted by a profile calibrated on the group's *other* rows and compared with the packaged
profile's prediction — before / after errors, never scoring a row the fit used.
Run bench/fit_speed.py first. Writes bench/results/planner_accuracy.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fit_speed import fit_group, load_rows, row_facts  # noqa: E402
from edgeinfer.errors import InputError  # noqa: E402
from edgeinfer.planning import calibrate, measurements, planner  # noqa: E402
from edgeinfer.planning.boards import get_board  # noqa: E402

MIB = 2**20


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def main() -> dict:
    rows = load_rows()
    fitted_rows = {}
    for r in rows:
        if r.get("model") and r.get("fit"):
            fitted_rows.setdefault(row_facts(r)["group"], []).append(r)
    out = []
    for r in rows:
        rec = {"row": r["row"], "grade": r["grade"], "board": r["board"], "runtime": r["runtime"],
               "model": r.get("model") or r.get("model_name"), "quant": r["quant"], "fit_row": bool(r.get("fit")),
               "measured_decode": r["decode"], "measured_mem_mib": r.get("mem_mib")}
        if not r.get("model"):
            rec["skipped"] = r.get("note", "model not in the catalog")
            out.append(rec)
            continue
        p = planner.plan(r["model"], r["board"], quant=r["quant"], ctx=r.get("mem_ctx", r["ctx"]),
                         runtime=r["runtime"], suggest=False)
        ps = planner.plan(r["model"], r["board"], quant=r["quant"], ctx=r["ctx"], runtime=r["runtime"],
                          suggest=False) if r.get("mem_ctx") else p
        dec = ps.estimates.decode_tokens_per_s
        rec["predicted_decode"] = dec
        rec["decode_abs_pct_error"] = round(abs(dec - r["decode"]) / r["decode"] * 100, 2) if dec else None
        rec["speed_basis"] = ps.estimates.basis
        rec["roofline_fraction"] = ps.estimates.roofline_fraction
        if r.get("mem_mib"):
            bd = p.breakdown
            pred = (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / MIB
            rec["predicted_mem_mib"] = round(pred, 1)
            rec["mem_abs_pct_error"] = round(abs(pred - r["mem_mib"]) / r["mem_mib"] * 100, 2)
        # leave-one-out for groups with >= 3 fitted rows
        f = row_facts(r)
        grp = fitted_rows.get(f["group"], [])
        if r.get("fit") and len(grp) >= 3:
            others = [o for o in grp if o is not r]
            xs = [row_facts(o)["bytes"] for o in others]
            ts = [1 / o["decode"] for o in others]
            t0, bw = fit_group(xs, ts)
            loo = 1 / (t0 + f["bytes"] / bw)
            rec["loo_predicted_decode"] = round(loo, 3)
            rec["loo_decode_abs_pct_error"] = round(abs(loo - r["decode"]) / r["decode"] * 100, 2)
        out.append(rec)
    ev = [x for x in out if "skipped" not in x]
    summary = {}
    for rt in sorted({x["runtime"] for x in ev}):
        xs = [x for x in ev if x["runtime"] == rt]
        summary[rt] = {"rows": [x["row"] for x in xs],
                       "median_decode_abs_pct_error": med([x["decode_abs_pct_error"] for x in xs]),
                       "median_mem_abs_pct_error": med([x.get("mem_abs_pct_error") for x in xs]),
                       "median_loo_decode_abs_pct_error": med([x.get("loo_decode_abs_pct_error") for x in xs])}
    rk = [x for x in ev if x["runtime"] == "rkllm" and x["grade"] == "A"]
    summary["rockchip_vendor_rows"] = {
        "rows": [x["row"] for x in rk],
        "median_decode_abs_pct_error": med([x["decode_abs_pct_error"] for x in rk]),
        "median_loo_decode_abs_pct_error": med([x.get("loo_decode_abs_pct_error") for x in rk]),
        "median_mem_abs_pct_error": med([x.get("mem_abs_pct_error") for x in rk])}
    rkc = [x for x in ev if x["runtime"] == "rkllm" and x["grade"] != "A"]
    summary["rockchip_community_rows"] = {
        "rows": [x["row"] for x in rkc],
        "median_decode_abs_pct_error": med([x["decode_abs_pct_error"] for x in rkc]),
        "median_mem_abs_pct_error": med([x.get("mem_abs_pct_error") for x in rkc])}
    result = {"rows": out, "summary": summary, "calibration_loo": calibration_loo(rows),
              "note": "groups fitted on a single row reproduce it exactly (0% error): that is not validation; "
                      "calibration_loo 'before' is the packaged profile, which was fitted on the rows marked "
                      "fit: true (in-sample for them); 'after' never saw the row it scores"}
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "planner_accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _checked(r: dict) -> dict:
    return measurements.check_row({k: v for k, v in r.items() if k != "prefill"}, f"row {r['row']}")


def calibration_loo(rows: list[dict]) -> dict:
    """Per (board, grade A | grades B-D) group with >= 2 planned rows: each row predicted by a profile calibrated
    on the group's other rows (after) and by the packaged profile (before); medians of the abs % errors."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("model"):
            groups.setdefault(f"{r['board']} {'grade A' if r['grade'] == 'A' else 'grades B-D'}", []).append(r)
    out = {}
    for key, grp in sorted(groups.items()):
        if len(grp) < 2:
            continue
        parent = get_board(grp[0]["board"])
        recs = []
        for r in grp:
            rec = {"row": r["row"], "model": r["model"], "quant": r["quant"], "measured_decode": r["decode"],
                   "in_packaged_fit": bool(r.get("fit"))}  # then "before" is in-sample for it
            train = [_checked(o) for o in grp if o is not r]
            try:
                board, _, _ = calibrate.calibrate(train, parent, where="the group's other rows")
            except InputError as e:
                rec["refused"] = e.one_line()
                recs.append(rec)
                continue
            held = calibrate.prepare([_checked(r)], parent)[0][0]
            for tag, b in (("before", parent), ("after", board)):
                pr = calibrate.predict(held, b)
                rec[f"decode_{tag}"] = pr["predicted_decode"]
                err = pr["decode_error_pct"]
                rec[f"decode_abs_pct_error_{tag}"] = abs(err) if err is not None else None
                if "mem_error_pct" in pr:
                    rec[f"mem_abs_pct_error_{tag}"] = abs(pr["mem_error_pct"])
            recs.append(rec)
        out[key] = {"rows": recs, **{f"median_{k}_abs_pct_error_{t}": med([x.get(f"{k}_abs_pct_error_{t}")
                                                                            for x in recs])
                                     for k in ("decode", "mem") for t in ("before", "after")}}
    return out


if __name__ == "__main__":
    res = main()
    print(f"{'row':>4s} {'gr':2s} {'board':20s} {'runtime':15s} {'model':28s} {'quant':10s} "
          f"{'meas':>7s} {'pred':>7s} {'err%':>6s} {'loo%':>6s} {'memM':>7s} {'memP':>7s} {'err%':>6s}")
    for x in res["rows"]:
        if "skipped" in x:
            print(f"{x['row']:>4} {x['grade']:2s} {x['board']:20s} {x['runtime']:15s} {str(x['model'])[:28]:28s} "
                  f"skipped: {x['skipped'][:50]}")
            continue
        f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        print(f"{x['row']:>4} {x['grade']:2s} {x['board']:20s} {x['runtime']:15s} {str(x['model'])[:28]:28s} "
              f"{x['quant']:10s} "
              f"{f(x['measured_decode'])} {f(x['predicted_decode']):>7s} {f(x['decode_abs_pct_error'],1):>6s} "
              f"{f(x.get('loo_decode_abs_pct_error'),1):>6s} {f(x['measured_mem_mib'],0):>7s} "
              f"{f(x.get('predicted_mem_mib'),0):>7s} "
              f"{f(x.get('mem_abs_pct_error'),1):>6s}")
    print(json.dumps(res["summary"], indent=1))
    print("calibration, leave-one-out (median abs % error before -> after):")
    for k, g in res["calibration_loo"].items():
        refused = sum(1 for x in g["rows"] if "refused" in x)
        b, a = g["median_decode_abs_pct_error_before"], g["median_decode_abs_pct_error_after"]
        print(f"  {k:30s} decode {b} -> {a}"
              f"   memory {g['median_mem_abs_pct_error_before']} -> {g['median_mem_abs_pct_error_after']}"
              f"   ({len(g['rows'])} rows{f', {refused} fits refused' if refused else ''})")
