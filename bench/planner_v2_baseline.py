"""The planner as shipped before issue 28 (commit 38430ea) on every published row: what it predicted, how far off.

This is the "before" of docs/planner.md#accuracy: the old planner, its packaged constants, boards and catalog,
on today's rows. Run it with the old checkout first on the path (no leave-one-out: the old constants were fixed):

    git worktree add /tmp/v2 38430ea
    export PYTHONPATH=/tmp/v2:/tmp/v2/plugins/ascend:/tmp/v2/plugins/onnxruntime:/tmp/v2/plugins/openvino
    PYTHONPATH=$PYTHONPATH:/tmp/v2/plugins/rknn \
        python bench/planner_v2_baseline.py bench/data/measured_rows.yaml bench/data/rows_*.yaml \
        > bench/results/planner_v2_baseline.json
"""
from __future__ import annotations

import json
import statistics

import yaml

from edgeinfer.planning import planner

MIB = 2**20


def vendor(board: str | None) -> str:
    b = board or ""
    if b.startswith("core-ultra"):
        return "intel"
    if "atlas" in b or "orange" in b:
        return "ascend"
    return "rockchip" if b.startswith("rk") else "host" if b == "host" else "other"


def predict(r: dict) -> dict:
    rec = {k: r.get(k) for k in ("row", "board", "runtime", "model", "quant", "grade", "fit")}
    try:
        if not r.get("model"):
            raise ValueError("no catalog model")
        p = planner.plan(r["model"], r["board"], quant=r["quant"], ctx=r.get("ctx"), runtime=r["runtime"],
                         suggest=False)
        dec = p.estimates.decode_tokens_per_s
        rec["pred"] = dec
        rec["decode_err"] = None if not dec else (dec - r["decode"]) / r["decode"] * 100
        if r.get("mem_mib"):
            bd = planner.plan(r["model"], r["board"], quant=r["quant"], ctx=r.get("mem_ctx", r.get("ctx")),
                              runtime=r["runtime"], suggest=False).breakdown
            pred = (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / MIB
            rec["mem_err"] = (pred - r["mem_mib"]) / r["mem_mib"] * 100
    except Exception as e:  # noqa: BLE001 - the old planner's refusal, whatever it was, is the finding
        rec["refused"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return rec


def summary(out: list[dict]) -> dict:
    summ = {}
    for v in sorted({vendor(x["board"]) for x in out}):
        xs = [x for x in out if vendor(x["board"]) == v]
        d = [abs(x["decode_err"]) for x in xs if x.get("decode_err") is not None]
        m = [x["mem_err"] for x in xs if x.get("mem_err") is not None]
        summ[v] = {"rows": len(xs), "decode_predicted": len(d),
                   "median_abs_decode_err": round(statistics.median(d), 1) if d else None,
                   "mem_rows": len(m), "median_abs_mem_err": round(statistics.median(map(abs, m)), 1) if m else None,
                   "mem_under": sum(1 for e in m if e < 0)}
    return summ


def main(paths: list[str]) -> dict:
    out = [predict(r) for path in paths for r in yaml.safe_load(open(path, encoding="utf-8"))["rows"]]
    return {"summary": summary(out), "rows": out}


if __name__ == "__main__":
    from _common import arguments

    ap = arguments(__doc__)
    ap.add_argument("rows", nargs="+", help="rows files (bench/data/*.yaml)")
    print(json.dumps(main(ap.parse_args().rows), indent=1))
