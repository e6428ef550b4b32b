"""Fit the speed-model constants and runtime memory overheads on the published rows, with left-out errors.

Rows: bench/data/measured_rows.yaml and every bench/data/rows_*.yaml (``load_rows``); rows marked ``fit: true``
are fitted. Decode (edgeinfer/planning/speed_fit.py, docs/planner.md#fit): per ``speed_group/runtime/format``
and per ``*/runtime/format`` (the runtime across groups), ``{t0_ms, bw_fraction, bw_cap_gbps}`` with the
transfer rule of edgeinfer/planning/speed.py; each entry's error bar is the median |error| of its rows when
their source (``source_id``, default ``source``) is left out of the fit (leave-one-source-out).
Prefill (edgeinfer/planning/prefill.py): TTFT = t0 + prompt × 2 × active params / (factor × peak ops), t0 fitted
where a key's prompts span 4×, else borrowed as decode's t0 is; its leave-one-source-out error as decode's.
Memory: per runtime, overhead = median of (peak − weights − KV held − activations), with a term
proportional to the weights only where it clearly lowers the left-out memory error.

Writes edgeinfer/data/speed_constants.json (read by the planner) and bench/results/fit_speed.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from edgeinfer.contract.schemes import normalize_scheme  # noqa: E402
from edgeinfer.errors import EdgeInferError  # noqa: E402
from edgeinfer.planning import measured_run, overhead, planner, prefill, speed_fit  # noqa: E402
from edgeinfer.planning.boards import get_board, host_board  # noqa: E402
from edgeinfer.planning.host_bandwidth import HostBandwidth  # noqa: E402
from edgeinfer.planning.models import resolve  # noqa: E402
from edgeinfer.planning.models.hf import spec_from_config  # noqa: E402
from edgeinfer.planning.quant import kv_bytes_per_element, runtime_kv_dtype  # noqa: E402

OUT = ROOT / "edgeinfer" / "data" / "speed_constants.json"
DATA = ROOT / "bench" / "data"
MIB = 2**20
PROPORTIONAL_MARGIN = 0.8  # the weights-proportional overhead must cut the left-out memory error by 20 %
VENDORS = {"rknn": "rockchip", "openvino": "intel", "ascend": "ascend", "host": "host"}


class CannotPredict(Exception):
    """A row the planner cannot predict; the message says what the user can do about it."""


def rows_files() -> list[Path]:
    return [DATA / "measured_rows.yaml", *sorted(DATA.glob("rows_*.yaml"))]


def load_rows(files: list[Path] | None = None) -> list[dict]:
    """Every row of the rows files, each with ``source_id`` (default: its source) and ``file``."""
    out = []
    for f in files or rows_files():
        for r in (yaml.safe_load(f.read_text()) or {}).get("rows") or []:
            out.append({**r, "source_id": r.get("source_id") or r.get("source") or f.name, "file": f.name})
    return out


@lru_cache(maxsize=None)
def _board(name: str):
    return get_board(name)


@lru_cache(maxsize=None)
def _host(gbps: float):
    """The host board at the bandwidth its row was measured at (not this machine's cached figure)."""
    return host_board(HostBandwidth(gbps, "the row's bandwidth_gbps (measured with the row)"))


def row_facts(r: dict) -> dict:
    """What the planner needs of a row (spec, board, scheme, bytes per step, speed key), or CannotPredict."""
    if not r.get("model"):
        raise CannotPredict(f"model {r.get('model_name') or '?'} is not in the catalog: add it, or give the row "
                            "a model_config")
    try:
        board = _host(r["bandwidth_gbps"]) if r["board"] == "host" and r.get("bandwidth_gbps") else _board(r["board"])
    except EdgeInferError:
        raise CannotPredict(f"no board profile '{r['board']}': add boards/{r['board']}.yaml") from None
    rt = board.runtimes.get(r["runtime"])
    if rt is None:
        raise CannotPredict(f"board {board.name} has no runtime {r['runtime']}: add it to its profile")
    try:
        spec = (spec_from_config(r["model_config"], r["model"], f"row {r['row']}") if r.get("model_config")
                else resolve(r["model"]))
        scheme = normalize_scheme(r["quant"])
    except EdgeInferError as e:
        raise CannotPredict(f"model {r['model']} / {r['quant']}: {e.one_line()}") from None
    prof = planner.runtime_profile(r["runtime"])
    kv_dtype = r.get("kv_dtype") or runtime_kv_dtype(prof, scheme)  # the row's, else the plan's
    kv_b = kv_bytes_per_element(kv_dtype, spec.head_dim)
    x = planner.decode_stream_bytes(spec, scheme, prof) + planner.kv_bytes(spec, r["ctx"], 1, kv_b)
    fk = planner.format_key(scheme)
    return {"spec": spec, "board": board, "scheme": scheme, "prof": prof, "bytes": x, "kv_b": kv_b,
            "vendor": VENDORS.get(board.backend, board.backend), "group": rt.speed_group, "format": fk,
            "key": f"{rt.speed_group}/{r['runtime']}/{fk}",
            "board_bw": board.bandwidth_gbps.value * 1e9 if board.bandwidth_gbps else None}


def _prefill(r: dict, f: dict) -> prefill.Measured | None:
    return prefill.measured(f["board"], f["spec"].params_active, r.get("prompt"), r.get("ttft_ms"), r.get("prefill"))


def points(rows: list[dict]) -> tuple[dict[str, list[speed_fit.Point]], list[str]]:
    """The fit rows as points per speed key, and a note per fit row left out (with why)."""
    by_key: dict[str, list[speed_fit.Point]] = {}
    notes = []
    for r in rows:
        if not r.get("fit"):
            continue
        try:
            f = row_facts(r)
        except CannotPredict as e:
            notes.append(f"row {r['row']}: not fitted: {e}")
            continue
        if not f["group"] or not f["board_bw"]:
            notes.append(f"row {r['row']}: not fitted: {r['runtime']} on {r['board']} has no speed group or "
                         "bandwidth")
            continue
        by_key.setdefault(f["key"], []).append(speed_fit.Point(
            r["row"], r["source_id"], r["board"], f["board_bw"], f["bytes"], 1 / r["decode"], _prefill(r, f)))
    return by_key, notes


# ----------------------------------------------------------------------------- memory overhead
def mem_items(rows: list[dict]) -> dict[str, list[dict]]:
    """Per runtime, the fit rows with a peak memory: planned weights and the residual overhead, MiB."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if not (r.get("fit") and r.get("mem_mib")) or r.get("mem_fit") is False:
            continue
        try:
            f = row_facts(r)
        except CannotPredict:
            continue
        out.setdefault(r["runtime"], []).append({"row": r["row"], "source": r["source_id"], **planned_mib(r, f)})
    return out


def planned_mib(r: dict, f: dict) -> dict:
    """A row's memory as it ran (``measured_run.row_bytes``, as ``edgeinfer calibrate`` plans a row), with the
    runtime's profile as it is: the onnxruntime host rows were last measured on 2026-12-06, after its decoders read
    a tied table from the LM head."""
    w, rest = measured_run.row_bytes(f["spec"], f["scheme"], f["prof"], f["kv_b"], r)
    return {"weights": w / MIB, "planned": rest / MIB, "measured": r.get("mem_mib"),
            "residual": r["mem_mib"] - rest / MIB if r.get("mem_mib") else None}


def overhead_value(ov: dict, weights_mib: float) -> float:
    """The planner's runtime overhead (MiB) for ``weights_mib`` of weights."""
    return overhead.runtime_overhead_bytes(ov, weights_mib * MIB) / MIB


def _fit_overhead(items: list[dict], proportional: bool) -> dict:
    if not proportional:
        return {"value": round(max(0.0, statistics.median(i["residual"] for i in items)), 1)}
    ws, rs = [i["weights"] for i in items], [i["residual"] for i in items]
    mw, mr = statistics.fmean(ws), statistics.fmean(rs)
    b = sum((w - mw) * (r - mr) for w, r in zip(ws, rs)) / (sum((w - mw) ** 2 for w in ws) or 1)
    return {"value": round(max(0.0, mr - b * mw), 1), "weights_fraction": round(max(0.0, b), 4)}


def _loso_mem(items: list[dict], proportional: bool) -> list[float]:
    errs = []
    for s in {i["source"] for i in items}:
        train = [i for i in items if i["source"] != s]
        if len(train) < (3 if proportional else 1):
            continue
        ov = _fit_overhead(train, proportional)
        errs += [abs(i["planned"] + overhead_value(ov, i["weights"]) - i["measured"]) / i["measured"] * 100
                 for i in items if i["source"] == s]
    return errs


def _use_proportional(items: list[dict]) -> bool:
    if len({i["source"] for i in items}) < 2:
        return False
    const, prop = _loso_mem(items, False), _loso_mem(items, True)
    return bool(prop) and statistics.median(prop) < PROPORTIONAL_MARGIN * statistics.median(const)


def fit_overheads(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for rt, items in mem_items(rows).items():
        n_src = len({i["source"] for i in items})
        use_prop = _use_proportional(items)
        errs = _loso_mem(items, use_prop)
        ov = _fit_overhead(items, use_prop)
        layers = " − layers × layer_overhead_mib" if planner.runtime_profile(rt).get("layer_overhead_mib") else ""
        ov["source"] = (f"bench/fit_speed.py: {'a constant + a share of the weights' if use_prop else 'median'} of "
                        f"(published peak memory − weights − KV − activations{layers}) over rows "
                        f"{[i['row'] for i in items]} of bench/data (docs/planner.md#fit)")
        ov["residuals_mib"] = {str(i["row"]): round(i["residual"], 1) for i in items}
        ov.update(error_pct=round(statistics.median(errs), 1) if n_src >= 2 and errs else None,
                  error_rows=len(errs) if n_src >= 2 else 0, error_sources=n_src,
                  error_basis=f"leave-one-source-out, {len(errs)} rows from {n_src} sources" if n_src >= 2 and errs
                  else "one source: not validated")
        out[rt] = ov
    return out


def fit_overheads_without(mem: dict[str, list[dict]], source: str) -> dict[tuple[str, bool], dict]:
    """The overheads fitted without ``source``: (runtime, True) the v3 model, (runtime, False) the median (v2)."""
    out = {}
    for rt, items in mem.items():
        train = [i for i in items if i["source"] != source]
        if train:  # the model's form is chosen on every row (as fit_overheads does), its terms refitted on train
            out[(rt, True)] = _fit_overhead(train, _use_proportional(items) and len(train) >= 3)
            out[(rt, False)] = _fit_overhead(train, False)
    return out


# ----------------------------------------------------------------------------- main
def fit(rows: list[dict]) -> dict:
    by_key, notes = points(rows)
    table = speed_fit.fit_table(by_key)
    errors = speed_fit.loso_errors(by_key)
    for k, c in table.items():
        c.update(errors[k])
        c["source"] = "bench/fit_speed.py on bench/data (docs/planner.md#fit)"
    prev = json.loads(OUT.read_text()) if OUT.is_file() else {}
    keep = {k: v for k, v in prev.get("overhead_mib", {}).items() if "bench/fit_speed.py" not in v.get("source", "")}
    return {"schema": "edgeinfer.speed_constants/2", "speed": dict(sorted(table.items())),
            "overhead_mib": {**keep, **fit_overheads(rows)}, "notes": notes}


def main() -> dict:
    result = fit(load_rows())
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    (ROOT / "bench" / "results" / "fit_speed.json").write_text(text)
    return result


if __name__ == "__main__":
    from _common import arguments

    arguments(__doc__).parse_args()
    res = main()
    print(f"{'key':40s} {'rows':>4s} {'t0 ms':>7s} {'frac':>6s} {'cap GB/s':>8s} {'prefill':>8s} {'fit%':>5s} "
          f"{'LOSO%':>6s}  fit")
    for k, v in res["speed"].items():
        pf = f"{v['prefill_factor']:.4f}" if v["prefill_factor"] else "-"
        cap = f"{v['bw_cap_gbps']:.1f}" if v["bw_cap_gbps"] else "-"
        err = "-" if v["error_pct"] is None else f"{v['error_pct']:.1f}"
        print(f"{k:40s} {v['n_rows']:>4d} {v['t0_ms']:7.2f} {v['bw_fraction']:6.3f} {cap:>8s} {pf:>8s} "
              f"{v['fit_median_abs_pct_error']:5.1f} {err:>6s}  {v['fit']}")
    for k, v in res["overhead_mib"].items():
        print(f"overhead {k}: {v['value']} MiB (+{v.get('weights_fraction', 0)} × weights)  "
              f"error {v.get('error_pct')}"
              f"  ({v.get('error_basis', v.get('source'))})")
    for n in res["notes"]:
        print(n)
