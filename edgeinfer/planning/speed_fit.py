"""Fit planning.speed's constants on measured decode points, and their leave-one-source-out error
(bench/fit_speed.py writes them to edgeinfer/data/speed_constants.json; docs/planner.md#fit).

Per key ``group/runtime/format`` (and ``*/runtime/format``: the runtime's points of every group):
* rows whose sizes (bytes per step) span >= T0_SPAN: t0 and the bandwidth term by weighted least squares on the
  relative error, robustly (the worst row is left out and named while it sits > 3 robust sigmas and > 15 % off);
  a narrower spread: t0 borrowed (the median t0 of the same group and runtime's other formats, else of the
  runtime's other groups, else 0) and named.
* boards of one bandwidth: cap = the fitted BW_eff, fraction = BW_eff / that bandwidth ("never faster than seen
  there, slower on slower memory"). Boards of different bandwidth: the cap model (software-bound) and the
  fraction model (hardware-bound, no cap) are both fitted; the fraction model is kept only where its median
  |error| is clearly lower. A fraction above 1 is clamped: the board's bandwidth is the ceiling.
* the host: its bandwidth is measured on each machine, so the fraction of it transfers (no cap).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from edgeinfer.errors import InputError
from edgeinfer.planning import calibrate, prefill, speed

SAME = 0.02  # values closer than this (relative) are one size / one bandwidth
OUTLIER_SIGMAS, OUTLIER_MIN, SIGMA_FLOOR = 3.0, 0.15, 0.03
T0_SPAN = 2.0  # t0 is fitted only where bytes per step span at least this factor: a narrower spread cannot
# separate a fixed cost from the bandwidth term (seven 7-8B rows fit t0 = 0 and miss a 0.6B row 3.7x)
HARDWARE_MARGIN = 0.8  # the fraction model must cut the median |error| of the cap model by 20 % to be kept


@dataclass(frozen=True)
class Point:
    """One measured row, reduced to what the decode fit needs."""

    row: object
    source: str  # the publication (row source_id, default its source): left out together
    board: str
    board_bw: float  # bytes/s
    x: float  # bytes read per decode step (weights streamed + KV at ctx)
    t: float  # seconds per token (1 / decode tok/s)
    prefill: prefill.Measured | None = None


def distinct(vals: Iterable[float]) -> int:
    xs = sorted(vals)
    return (1 + sum(1 for a, b in zip(xs, xs[1:]) if b > a * (1 + SAME))) if xs else 0


def spans(xs: Iterable[float]) -> bool:
    """Do these sizes (bytes per step) span enough to fit t0?"""
    xs = list(xs)
    return bool(xs) and max(xs) >= T0_SPAN * min(xs)


def _line(zs: list[float], ts: list[float], t0_fixed: float | None) -> tuple[float, float]:
    try:
        return calibrate.fit_line(zs, ts, t0_fixed)
    except InputError:  # a borrowed t0 longer than a measured step: the row says t0 is smaller
        return calibrate.fit_line(zs, ts, 0.0)


def _robust(zs: list[float], ts: list[float], t0_fixed: float | None) -> tuple[float, float, list[int]]:
    """(t0 s, bandwidth term, indices kept): least squares, leaving out the worst row while it is an outlier."""
    idx = list(range(len(zs)))
    while True:
        t0, bw = _line([zs[i] for i in idx], [ts[i] for i in idx], t0_fixed)
        res = {i: abs((t0 + zs[i] / bw) / ts[i] - 1) for i in idx}
        if len(idx) < 4:
            return t0, bw, idx
        sigma = max(SIGMA_FLOOR, 1.4826 * statistics.median(res.values()))
        worst = max(idx, key=res.get)
        rest = [i for i in idx if i != worst]
        if res[worst] <= max(OUTLIER_MIN, OUTLIER_SIGMAS * sigma) or (
                t0_fixed is None and not spans(zs[i] for i in rest)):
            return t0, bw, idx
        idx = rest


def _rel_errors(c: dict, pts: list[Point]) -> list[float]:
    return [abs(p.t / speed.step_seconds(c, p.board_bw, p.x) - 1) * 100 for p in pts]


def fit_points(pts: list[Point], t0_borrowed: tuple[float, str] | None = None) -> dict:
    """Constants for one key; ``t0_borrowed`` (seconds, where from) is used when the sizes do not span T0_SPAN."""
    xs, ts = [p.x for p in pts], [p.t for p in pts]
    several = spans(xs)
    fixed = None if several else (t0_borrowed[0] if t0_borrowed else 0.0)
    t0, cap, keep = _robust(xs, ts, fixed)
    low = min(pts[i].board_bw for i in keep)
    c = {"t0_ms": t0 * 1000, "bw_fraction": min(1.0, cap / low), "bw_cap_gbps": cap / 1e9}
    boards = distinct(p.board_bw for p in pts)
    how = (f"one board bandwidth ({low / 1e9:g} GB/s): never faster than seen there (cap = BW_eff), slower on "
           "slower memory (fraction = BW_eff / that bandwidth)") if boards < 2 else (
        f"{boards} board bandwidths: software-bound (cap = BW_eff; the fraction model was not clearly better)")
    if boards < 2 and all(p.board == "host" for p in pts):  # a measured bandwidth scales to the next machine
        c["bw_cap_gbps"] = None
        how = (f"the host's measured bandwidth ({low / 1e9:g} GB/s): BW_eff = fraction × the machine's measured "
               "bandwidth, no cap")
    if boards >= 2:
        t0h, frac, keep_h = _robust([p.x / p.board_bw for p in pts], ts, fixed)
        hw = {"t0_ms": t0h * 1000, "bw_fraction": min(1.0, frac), "bw_cap_gbps": None}
        if statistics.median(_rel_errors(hw, pts)) < HARDWARE_MARGIN * statistics.median(_rel_errors(c, pts)):
            c, keep = hw, keep_h
            how = f"{boards} board bandwidths: hardware-bound (BW_eff = fraction × the board's bandwidth, no cap)"
    if cap / low > 1 and c["bw_cap_gbps"] is not None:
        how += "; faster than the board's bandwidth: held at it"
    t0_how = ("t0 fitted" if several else
              f"t0 borrowed from {t0_borrowed[1]}" if t0_borrowed else "t0 0: no other constants of this runtime "
                                                                         "to borrow one from")
    kept = [pts[i] for i in keep]
    errs = _rel_errors(c, pts)
    return {
        "t0_ms": round(c["t0_ms"], 3), "bw_fraction": round(c["bw_fraction"], 4),
        "bw_cap_gbps": round(c["bw_cap_gbps"], 2) if c["bw_cap_gbps"] is not None else None,
        "fit_boards": {p.board: round(speed.effective_bandwidth(c, p.board_bw) / 1e9, 2) for p in pts},
        "n_rows": len(pts), "rows": [p.row for p in pts], "sources": sorted({p.source for p in pts}),
        "outlier_rows": [p.row for p in pts if p not in kept],
        "fit": f"{t0_how}; {how}", "fit_median_abs_pct_error": round(statistics.median(errs), 2),
    }


def with_stars(by_key: dict[str, list[Point]]) -> dict[str, list[Point]]:
    """The keys plus ``*/runtime/format``: every group's points of that runtime and format."""
    out = {k: list(v) for k, v in by_key.items() if v}
    for k, pts in by_key.items():
        if pts and not k.startswith("*/"):
            out.setdefault("*/" + k.split("/", 1)[1], []).extend(pts)
    return out


def _donor(table: dict, key: str, field: str = "") -> tuple[float, str] | None:
    """The median fitted t0 of the same group and runtime, else of the runtime's other groups (a group key never
    borrows from a ``*`` key, which mixes groups; a ``*`` key borrows from ``*`` keys first); ``field``
    "prefill_": the prefill t0."""
    group, runtime, _ = key.split("/", 2)
    star = group == "*"
    for pred in (lambda g, r: g == group and r == runtime, lambda g, r: r == runtime and (star or g != "*")):
        keys = sorted(k for k, v in table.items() if pred(*k.split("/", 2)[:2])
                      and (v.get(f"{field}fit") or "").startswith("t0 fitted"))
        if keys:
            return statistics.median(table[k][f"{field}t0_ms"] for k in keys) / 1000, ", ".join(keys)
    return None


def fit_table(by_key: dict[str, list[Point]]) -> dict[str, dict]:
    """Constants for every key (and its ``*`` key): several-size keys first, so one-size keys can borrow t0."""
    keys = with_stars(by_key)
    table: dict[str, dict] = {}
    for k in sorted(keys, key=lambda k: (not spans(p.x for p in keys[k]), k)):
        several = spans(p.x for p in keys[k])
        table[k] = fit_points(keys[k], None if several else _donor(table, k))
    measured = {k: [p.prefill for p in pts if p.prefill] for k, pts in keys.items()}
    for k in sorted(measured, key=lambda k: (not prefill.spans(measured[k]), k)):
        ms = measured[k]
        table[k].update(prefill.fit(ms, None if prefill.spans(ms) or not ms else _donor(table, k, "prefill_")))
    return table


def without(by_key: dict[str, list[Point]], source: str) -> dict[str, list[Point]]:
    return {k: [p for p in v if p.source != source] for k, v in by_key.items()}


def loso_errors(by_key: dict[str, list[Point]]) -> dict[str, dict]:
    """Per key: its points' |error| % when each source is left out of the whole fit and the key refitted, for
    decode (``error_*``) and for the TTFT of the points that have one (``prefill_error_*``)."""
    keys = with_stars(by_key)
    errs: dict[str, list[float]] = {k: [] for k in keys}
    pre: dict[str, list[float]] = {k: [] for k in keys}
    for s in sorted({p.source for pts in keys.values() for p in pts}):
        tab = fit_table(without(by_key, s))
        for k, pts in keys.items():
            left = [p for p in pts if p.source == s]
            if left and k in tab:
                errs[k] += _rel_errors(tab[k], left)
                if tab[k]["prefill_factor"]:
                    pre[k] += prefill.errors(tab[k], [p.prefill for p in left if p.prefill])
    out = {}
    for k, pts in keys.items():
        out[k] = {**_left_out(errs[k], {p.source for p in pts}),
                  **{f"prefill_{n}": v for n, v in _left_out(pre[k], {p.source for p in pts if p.prefill}).items()}}
    return out


def _left_out(errs: list[float], sources: set[str]) -> dict:
    if len(sources) < 2 or not errs:
        return {"error_pct": None, "error_rows": 0, "error_sources": len(sources),
                "error_basis": "one source: not validated" if sources else "no rows"}
    return {"error_pct": round(statistics.median(errs), 1), "error_rows": len(errs), "error_sources": len(sources),
            "error_basis": f"leave-one-source-out, {len(errs)} rows from {len(sources)} sources"}
