"""Planner accuracy on every published row, leave-one-source-out (docs/planner.md#accuracy).

For every row of bench/data/measured_rows.yaml and bench/data/rows_*.yaml (bench/fit_speed.py's ``load_rows``):
decode tok/s and peak memory predicted by constants fitted *without the row's source* (``source_id``, default
``source``), or "cannot predict: <why>". Twice: "after" = the v3 speed model (planning.speed: t0 + bytes /
min(cap, fraction × bandwidth), robust fit, ``*/runtime`` and other-format fallbacks) and "before" = planner v2's
rule (t0 + bytes / (fraction × bandwidth), fitted per group, t0 borrowed or 0, a format with no row takes the
median of the group's others), on the same left-out rows. Memory: "after" = the fitted overhead model,
"before" = the median overhead (v2), both refitted without the row's source (a runtime left with no rows
takes runtimes.yaml's overhead). Per vendor (board backend) and runtime: rows, sources, predicted, refused,
median |error| decode and memory. Calibration, leave-one-out (``calibration_loo``): each row predicted by an
``edgeinfer calibrate`` profile made from the other rows of its board and grade.
Writes bench/results/planner_accuracy.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fit_speed import (  # noqa: E402
    VENDORS,
    CannotPredict,
    fit_overheads_without,
    load_rows,
    mem_items,
    overhead_value,
    planned_mib,
    points,
    row_facts,
)
from edgeinfer.errors import EdgeInferError  # noqa: E402
from edgeinfer.planning import calibrate, measurements, planner, speed, speed_fit  # noqa: E402
from edgeinfer.planning.boards import get_board  # noqa: E402

GOALS = {"decode": 15.0, "memory": 10.0}  # issue 28: median |error| per vendor on left-out rows


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def pct(pred: float, meas: float) -> float:
    return round(abs(pred - meas) / meas * 100, 2)


# ----------------------------------------------------------------------------- planner v2's rule ("before")
def v2_table(by_key: dict[str, list[speed_fit.Point]]) -> dict[str, dict]:
    """Per group key: t0 and fraction of the first row's board bandwidth; one size: t0 borrowed or 0."""
    table: dict[str, dict] = {}
    for key in sorted((k for k, v in by_key.items() if v), key=lambda k: -len(by_key[k])):
        pts = by_key[key]
        xs, ts = [p.x for p in pts], [p.t for p in pts]
        donors = [v["t0_ms"] / 1000 for k, v in table.items() if k.startswith(key.rsplit("/", 1)[0] + "/")]
        fixed = None if speed_fit.distinct(xs) >= 2 else (statistics.median(donors) if donors else 0.0)
        try:
            t0, bw = calibrate.fit_line(xs, ts, fixed)
        except EdgeInferError:
            t0, bw = calibrate.fit_line(xs, ts, 0.0)
        table[key] = {"t0_ms": t0 * 1000, "bw_fraction": bw / pts[0].board_bw}
    return table


def v2_lookup(table: dict, group: str, runtime: str, fk: str) -> dict | None:
    key = f"{group}/{runtime}/{fk}"
    if key in table:
        return table[key]
    same = [v for k, v in table.items() if k.startswith(f"{group}/{runtime}/")]
    if not same:
        return None
    return {"t0_ms": sorted(v["t0_ms"] for v in same)[len(same) // 2],
            "bw_fraction": sorted(v["bw_fraction"] for v in same)[len(same) // 2]}


# ----------------------------------------------------------------------------- rows
def _decode(rec: dict, r: dict, f: dict, new: dict, old: dict) -> None:
    if not f["board_bw"]:
        rec["cannot_predict"] = f"board {r['board']} claims no memory bandwidth: give bandwidth_gbps in its profile"
        return
    if not f["group"]:
        rec["cannot_predict"] = f"{r['runtime']} on {r['board']} has no speed_group: set one in the board profile"
        return
    found = speed.lookup(new, f["group"], r["runtime"], f["format"])
    if found.consts is None:
        rec["cannot_predict"] = found.basis
    else:
        d = 1 / speed.step_seconds(found.consts, f["board_bw"], f["bytes"])
        rec.update(decode_after=round(d, 3), decode_err_after=pct(d, r["decode"]), basis_after=found.basis)
    c = v2_lookup(old, f["group"], r["runtime"], f["format"])
    if c:
        d = 1 / (c["t0_ms"] / 1000 + f["bytes"] / (c["bw_fraction"] * f["board_bw"]))
        rec.update(decode_before=round(d, 3), decode_err_before=pct(d, r["decode"]))


def _memory(rec: dict, r: dict, f: dict, fitted: dict[str, dict]) -> None:
    m = planned_mib(r, f)
    static = (planner.runtime_profiles().get(r["runtime"]) or {}).get("overhead_mib") or {"value": 0}
    for tag, proportional in (("after", True), ("before", False)):
        ov = fitted.get((r["runtime"], proportional)) or static
        mem = m["planned"] + overhead_value(ov, m["weights"])
        rec[f"mem_{tag}"], rec[f"mem_err_{tag}"] = round(mem, 1), pct(mem, r["mem_mib"])


def vendor_of(r: dict) -> str:
    """The board's backend as a vendor, else the rows file's (rows_<vendor>.yaml)."""
    if r["board"] == "host":
        return "host"
    try:
        return VENDORS.get(get_board(r["board"]).backend, "other")
    except EdgeInferError:
        name = r.get("file", "")
        return name[5:-5] if name.startswith("rows_") else "unknown board"


def predict_rows(rows: list[dict]) -> list[dict]:
    by_key, _ = points(rows)
    mem = mem_items(rows)
    tables: dict[str, tuple] = {}
    out = []
    for r in rows:
        rec = {k: r.get(k) for k in ("row", "grade", "board", "runtime", "runtime_version", "quant", "decode",
                                     "mem_mib", "fit")}
        rec.update(model=r.get("model") or r.get("model_name"), source=r["source_id"])
        if r.get("runtime_version"):
            rec["runtime_version"] = r["runtime_version"]
        out.append(rec)
        rec["vendor"] = vendor_of(r)
        try:
            f = row_facts(r)
        except CannotPredict as e:
            rec["cannot_predict"] = str(e)
            continue
        s = r["source_id"]
        if s not in tables:
            left = speed_fit.without(by_key, s)
            tables[s] = (speed_fit.fit_table(left), v2_table(left), fit_overheads_without(mem, s))
        new, old, ovs = tables[s]
        _decode(rec, r, f, new, old)
        if r.get("mem_mib"):
            _memory(rec, r, f, ovs)
    return out


def summarise(recs: list[dict], key) -> dict:
    """Per group: counts, and the median |errors| on the rows with their setup stated (``fit: true``; the
    goals' basis) and on every row (``all_rows_``: adds the lower bounds and hearsay marked ``fit: false``)."""
    groups: dict[str, list[dict]] = {}
    for x in recs:
        groups.setdefault(key(x), []).append(x)
    out = {}
    for k, xs in sorted(groups.items()):
        fit = [x for x in xs if x.get("fit")]
        out[k] = {"rows": len(xs), "fit_rows": len(fit), "sources": len({x["source"] for x in xs}),
                  "predicted": sum(1 for x in xs if "decode_after" in x),
                  "refused": sum(1 for x in xs if "cannot_predict" in x),
                  "predicted_before": sum(1 for x in xs if "decode_before" in x),
                  **{f"median_{m}_abs_pct_error_{t}": med([x.get(f"{m}_err_{t}") for x in fit])
                     for m in ("decode", "mem") for t in ("after", "before")},
                  **{f"all_rows_median_{m}_abs_pct_error_{t}": med([x.get(f"{m}_err_{t}") for x in xs])
                     for m in ("decode", "mem") for t in ("after", "before")},
                  "mem_rows": sum(1 for x in xs if "mem_err_after" in x and x.get("fit")),
                  # before vs after on the same rows: those both rules predicted
                  **{f"common_rows_median_decode_abs_pct_error_{t}": med([x.get(f"decode_err_{t}") for x in fit
                                                                          if "decode_before" in x and
                                                                          "decode_after" in x])
                     for t in ("after", "before")}}
    return out


def main() -> dict:
    rows = load_rows()
    recs = predict_rows(rows)
    vendor = lambda x: x["vendor"]  # noqa: E731
    result = {"method": "leave-one-source-out: every row predicted by constants fitted without its source",
              "goals_median_abs_pct_error": GOALS,
              "by_vendor": summarise(recs, vendor),
              "by_runtime": summarise(recs, lambda x: f"{vendor(x)} / {x['runtime']}"),
              "rows": recs, "calibration_loo": calibration_loo(rows)}
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "planner_accuracy.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ----------------------------------------------------------------------------- calibrate, leave-one-out
def _checked(r: dict) -> dict:
    return measurements.check_row({k: v for k, v in r.items() if k not in ("prefill", "file")}, f"row {r['row']}")


def calibration_loo(rows: list[dict]) -> dict:
    """Per (board, grade A | grades B-D, runtime release where stated) group with >= 2 planned rows: each row
    predicted by a profile calibrated on the group's other rows (after) and by the packaged profile (before);
    medians of the abs % errors. Releases are kept apart: a user calibrates on one release's measurements."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("model"):
            release = f" {r['runtime']} {r['runtime_version']}" if r.get("runtime_version") else ""
            groups.setdefault(f"{r['board']} {'grade A' if r['grade'] == 'A' else 'grades B-D'}{release}",
                              []).append(r)
    out = {}
    for key, grp in sorted(groups.items()):
        try:
            parent = get_board(grp[0]["board"])
        except EdgeInferError:
            continue
        if len(grp) < 2 or parent.bandwidth_gbps is None:
            continue
        recs = []
        for r in grp:
            rec = {"row": r["row"], "model": r["model"], "quant": r["quant"], "measured_decode": r["decode"],
                   "in_packaged_fit": bool(r.get("fit"))}
            try:
                board, _, _ = calibrate.calibrate([_checked(o) for o in grp if o is not r], parent,
                                                  where="the group's other rows", force=True)  # LOO: as fitted
                held = calibrate.prepare([_checked(r)], parent)[0][0]
            except EdgeInferError as e:
                rec["refused"] = e.one_line()
                recs.append(rec)
                continue
            for tag, b in (("before", parent), ("after", board)):
                pr = calibrate.predict(held, b)
                err = pr["decode_error_pct"]
                rec[f"decode_abs_pct_error_{tag}"] = abs(err) if err is not None else None
                if "mem_error_pct" in pr:
                    rec[f"mem_abs_pct_error_{tag}"] = abs(pr["mem_error_pct"])
            recs.append(rec)
        out[key] = {"rows": recs, **{f"median_{k}_abs_pct_error_{t}": med([x.get(f"{k}_abs_pct_error_{t}")
                                                                            for x in recs])
                                     for k in ("decode", "mem") for t in ("before", "after")}}
    return out


def print_table(res: dict) -> None:
    f = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
    print("median |error| % on left-out rows with their setup stated (fit: true), (rows predicted, all grades); "
          "after on every row, in []")
    print(f"{'vendor / runtime':30s} {'rows':>4s} {'fit':>3s} {'src':>3s} {'pred':>4s} {'refused':>7s} "
          f"{'decode before → after [all]':>34s} {'memory before → after [all]':>28s}")
    for part in ("by_vendor", "by_runtime"):
        for k, v in res[part].items():
            d = f"{f(v['median_decode_abs_pct_error_before'])} ({v['predicted_before']}) → " \
                f"{f(v['median_decode_abs_pct_error_after'])} ({v['predicted']}) " \
                f"[{f(v['all_rows_median_decode_abs_pct_error_after'])}]"
            m = f"{f(v['median_mem_abs_pct_error_before'])} → {f(v['median_mem_abs_pct_error_after'])} " \
                f"[{f(v['all_rows_median_mem_abs_pct_error_after'])}]"
            print(f"{k:30s} {v['rows']:>4d} {v['fit_rows']:>3d} {v['sources']:>3d} {v['predicted']:>4d} "
                  f"{v['refused']:>7d} {d:>34s} {m:>28s}")
        print()
    for x in res["rows"]:
        if "cannot_predict" in x:
            release = f" {x['runtime_version']}" if x.get("runtime_version") else ""
            print(f"row {x['row']} ({x['board']}, {x['runtime']}{release}, {x['model']}): "
                  f"cannot predict: {x['cannot_predict']}")


if __name__ == "__main__":
    from _common import arguments

    arguments(__doc__).parse_args()
    res = main()
    print_table(res)
    print("calibration, leave-one-out (median abs % error before -> after):")
    for k, g in res["calibration_loo"].items():
        refused = sum(1 for x in g["rows"] if "refused" in x)
        print(f"  {k:30s} decode {g['median_decode_abs_pct_error_before']} -> "
              f"{g['median_decode_abs_pct_error_after']}"
              f"   memory {g['median_mem_abs_pct_error_before']} -> {g['median_mem_abs_pct_error_after']}"
              f"   ({len(g['rows'])} rows{f', {refused} fits refused' if refused else ''})")
