"""Fit a board's speed constants and runtime overhead to the user's own measurements.

Decode model (docs/planner.md#speed-model): time per token = t0 + bytes_per_token / BW_eff (planning.speed),
per runtime and weight format; the calibrated constants are the board's own (BW_eff = bw_fraction ×
bandwidth, no cap). With measured rows of at least two different sizes, t0 and the bandwidth are fitted
by least squares on the relative error (each row weighted by 1/its time); one size only:
t0 is kept from the parent board and the bandwidth scaled so the row is met exactly. Formats of a
measured runtime that have no row move by the runtime's median bandwidth scale. A group fitted on one row
trusts that row fully (nothing checks it), so it may move the board's estimates by at most MAX_ONE_ROW_MOVE
unless the caller forces it. Memory: the runtime
overhead becomes the median of (measured peak − planned weights, KV cache and activations).
The result is the parent board's profile with these constants inline and a ``calibration`` record.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.contract.schemes import Scheme, normalize_scheme
from edgeinfer.errors import InputError
from edgeinfer.planning import measured_run, planner, prefill, speed
from edgeinfer.planning.boards import Board, board_from_dict
from edgeinfer.planning.models import resolve
from edgeinfer.planning.models.hf import spec_from_config
from edgeinfer.planning.models.spec import ModelSpec
from edgeinfer.planning.quant import kv_bytes_per_element, runtime_kv_dtype

MIB = 2**20
SAME_SIZE = 0.02  # rows whose bytes per token differ less than this are one size
CONTRADICTION = 0.30  # the same size measured this much apart, or a larger model this much faster
MAX_FRACTION = 1.5  # SpeedConst's ceiling: faster than 1.5 × the physical bandwidth is not a measurement
PREFILL_KEYS = ("prefill_factor", "prefill_t0_ms")
MAX_ONE_ROW_MOVE = 2.0  # a single row moves a board's decode estimates by at most this factor without --force


@dataclass
class Row:
    data: dict[str, Any]
    spec: ModelSpec
    scheme: Scheme
    runtime: str
    bytes_per_token: float  # weights streamed + KV read at ctx

    @property
    def key(self) -> str:
        return f"{self.runtime}/{planner.format_key(self.scheme)}"

    @property
    def seconds(self) -> float:
        return 1.0 / self.data["decode"]


@dataclass
class Group:
    rows: list[Row]
    t0_s: float = 0.0
    bw: float = 0.0  # bytes/s
    how: str = ""
    scale: float | None = None  # new bandwidth / the parent's, when the parent has constants
    prefill: dict = field(default_factory=dict)  # prefill.fit's, or the parent's prefill_factor, prefill_t0_ms
    parent: dict | None = field(default=None)


def _spec(d: dict[str, Any]) -> ModelSpec:
    if "model_config" in d:
        return spec_from_config(d["model_config"], d["model"], d["where"])
    return resolve(d["model"])


def decoder_runtime(b: Board) -> str:
    """The runtime a row without one was measured with: the board's preferred decoder runtime (its default
    runtime first)."""
    order = [b.default_runtime, *b.runtimes]
    return next((r for r in order if r and "decoder" in b.runtimes[r].kinds), b.default_runtime)


def prepare(rows: list[dict[str, Any]], parent: Board) -> tuple[list[Row], list[str]]:
    """Rows of ``parent`` with their planner facts; rows for other boards are left out (noted)."""
    out, notes = [], []
    for d in rows:
        if d.get("board") and d["board"] != parent.name:
            notes.append(f"{d['where']}: skipped (board {d['board']}, calibrating {parent.name})")
            continue
        rt = d.get("runtime") or decoder_runtime(parent)
        if rt not in parent.runtimes:
            raise InputError(f"{d['where']}: board {parent.name} has no runtime '{rt}'",
                             "runtimes: " + ", ".join(parent.runtimes))
        scheme = normalize_scheme(d["quant"])
        if scheme.name not in parent.runtimes[rt].schemes:
            raise InputError(f"{d['where']}: {rt} on {parent.name} does not run {scheme.name}",
                             "schemes: " + ", ".join(parent.runtimes[rt].schemes))
        spec = _spec(d)
        if spec.encoder or not spec.has_kv:
            raise InputError(f"{d['where']}: {spec.name} is not a decoder; calibration fits decode speed")
        prof = planner.runtime_profile(rt)
        kv_b = kv_bytes_per_element(d.get("kv_dtype") or runtime_kv_dtype(prof, scheme), spec.head_dim)
        x = planner.decode_stream_bytes(spec, scheme, prof) + planner.kv_bytes(spec, d["ctx"], 1, kv_b)
        out.append(Row(d, spec, scheme, rt, float(x)))
    if not out:
        raise InputError(f"no measurement row is for board {parent.name}",
                         "pass --board with the board the rows were measured on")
    return out, notes


def check_consistent(group: list[Row]) -> None:
    """Same size measured far apart, or a larger model clearly faster than a smaller one: refuse."""
    ordered = sorted(group, key=lambda r: r.bytes_per_token)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            same = b.bytes_per_token <= a.bytes_per_token * (1 + SAME_SIZE)
            if same and max(a.seconds, b.seconds) > min(a.seconds, b.seconds) * (1 + CONTRADICTION):
                raise InputError(f"contradictory measurements: {a.data['where']} and {b.data['where']} measure the "
                                 f"same size at {a.data['decode']:g} and {b.data['decode']:g} tokens/s",
                                 "drop the row that is wrong, or re-measure")
            if not same and b.seconds * (1 + CONTRADICTION) < a.seconds:
                raise InputError(f"contradictory measurements: {b.data['where']} ({b.spec.name}) reads more "
                                 f"bytes per token than {a.data['where']} ({a.spec.name}) yet decodes faster "
                                 f"({b.data['decode']:g} vs {a.data['decode']:g} tokens/s)",
                                 "check the model, quant and ctx of both rows")


def fit_line(xs: list[float], ts: list[float], t0_fixed: float | None = None) -> tuple[float, float]:
    """Weighted least squares of t = t0 + x / bw with weights 1/t (relative error); (t0 s, bw B/s).
    ``t0_fixed`` or a single size: only bw. A negative t0 refits with t0 = 0."""
    if t0_fixed is not None or len(set(xs)) < 2:
        t0 = t0_fixed or 0.0
        num = sum((x / t) * ((t - t0) / t) for x, t in zip(xs, ts))
        den = sum((x / t) ** 2 for x, t in zip(xs, ts))
        if num <= 0:
            raise InputError("measurements are faster than the fixed per-token time t0 allows",
                             "check the rows' decode figures (tokens per second)")
        return t0, den / num
    s11 = sum(1 / t**2 for t in ts)
    s12 = sum(x / t**2 for x, t in zip(xs, ts))
    s22 = sum((x / t) ** 2 for x, t in zip(xs, ts))
    b1 = sum(1 / t for t in ts)
    b2 = sum(x / t for x, t in zip(xs, ts))
    det = s11 * s22 - s12 * s12
    t0 = (b1 * s22 - b2 * s12) / det
    a = (s11 * b2 - s12 * b1) / det
    if t0 < 0 or a <= 0:
        return fit_line(xs, ts, t0_fixed=0.0)
    return t0, 1.0 / a


def _sizes(rows: list[Row]) -> int:
    xs = sorted(r.bytes_per_token for r in rows)
    return 1 + sum(1 for a, b in zip(xs, xs[1:]) if b > a * (1 + SAME_SIZE))


def fit_group(rows: list[Row], parent: Board) -> Group:
    g = Group(rows)
    r0 = rows[0]
    consts = planner.speed_constants(parent, r0.runtime, r0.scheme).consts
    g.parent = consts
    bw_board = parent.bandwidth_gbps.value * 1e9
    xs, ts = [r.bytes_per_token for r in rows], [r.seconds for r in rows]
    if _sizes(rows) >= 2:
        g.t0_s, g.bw = fit_line(xs, ts)
        g.how = f"t0 and bandwidth fitted on {len(rows)} rows"
    else:
        t0 = consts["t0_ms"] / 1000 if consts else 0.0
        g.t0_s, g.bw = fit_line(xs, ts, t0_fixed=t0)
        g.how = f"bandwidth scale only ({len(rows)} row{'s' if len(rows) > 1 else ''} of one size; t0 " + (
            "kept from the parent)" if consts else "0: the parent has no constants)")
    frac = g.bw / bw_board
    if frac > MAX_FRACTION:
        raise InputError(f"rows {', '.join(r.data['where'] for r in rows)} imply {frac:.1f}× the memory bandwidth "
                         f"of {parent.name} ({parent.bandwidth_gbps.value:g} GB/s)",
                         "the board, model or quant of these rows is wrong")
    if consts:
        g.scale = frac / (speed.effective_bandwidth(consts, bw_board) / bw_board)
    g.prefill = _prefill(rows, parent) or {**{k: (consts or {}).get(k) for k in PREFILL_KEYS},
                                            "prefill_fit": "kept from the parent (no row with a prompt and a TTFT)"}
    return g


def _prefill(rows: list[Row], b: Board) -> dict | None:
    """The prefill constants of the rows with a prompt and a TTFT (t0 fitted where their prompts span 4×)."""
    ms = [m for r in rows if (m := prefill.measured(b, r.spec.params_active, r.data.get("prompt"),
                                                    r.data.get("ttft_ms"), nominal=True))]
    unit = "of the board's peak" if prefill.peak_ops(b) else "effective TOPS (the board states no peak)"
    return {**prefill.fit(ms), "prefill_factor_is": unit} if ms else None


def overhead_mib(rows: list[Row], parent: Board) -> dict[str, tuple[float, list[str]]]:
    """Per runtime: median of measured peak − planned (weights + KV + activations), MiB, and the rows."""
    res: dict[str, list[tuple[str, float]]] = {}
    for r in rows:
        if not r.data.get("mem_mib"):
            continue
        prof = planner.runtime_profile(r.runtime)
        kv_b = kv_bytes_per_element(r.data.get("kv_dtype") or runtime_kv_dtype(prof, r.scheme), r.spec.head_dim)
        _, planned = measured_run.row_bytes(r.spec, r.scheme, prof, kv_b, r.data)
        res.setdefault(r.runtime, []).append((r.data["where"], (r.data["mem_mib"] * MIB - planned) / MIB))
    return {rt: (max(0.0, statistics.median(v for _, v in items)), [w for w, _ in items])
            for rt, items in res.items()}


def _constants(t0_s: float, frac: float, pre: dict, source: str, err: float | None,
               err_basis: str) -> dict[str, Any]:
    """Inline constants of the calibrated board (no cap: they are this board's own)."""
    return {"t0_ms": round(t0_s * 1000, 4), "bw_fraction": round(frac, 5), **pre, "source": source,
            "error_pct": err, "error_basis": err_basis}


def _in_sample_error(g: Group) -> float:
    return round(statistics.median(abs(1 / (g.t0_s + r.bytes_per_token / g.bw) * r.seconds - 1) * 100
                                   for r in g.rows), 2)


def trust(g: Group) -> str:
    """How much the group's rows are trusted, in words (printed by ``calibrate``, kept in the record)."""
    n, sizes = len(g.rows), _sizes(g.rows)
    if n == 1:
        return ("one row, trusted fully: the bandwidth is scaled so that it is met exactly and nothing checks it "
                "(a second row, of another model or context, would)")
    if sizes == 1:
        return (f"{n} rows of one size: the bandwidth is their least-squares scale (in-sample error "
                f"{_in_sample_error(g)}%); t0 is not fitted")
    return f"{n} rows of {sizes} sizes: t0 and bandwidth fitted (in-sample error {_in_sample_error(g)}%)"


def _estimate_move(g: Group, before: list[dict[str, Any]], after: list[dict[str, Any]]) -> float:
    """The factor (≥ 1) by which the group moves decode estimates: its rows' predictions before and after, and its
    bandwidth scale (which formats without a row follow)."""
    moves = [max(a / b, b / a) for a, b in zip(after, before) if a and b]
    if g.scale:
        moves.append(max(g.scale, 1 / g.scale))
    return max(moves, default=1.0)


def check_one_row_moves(groups: dict[str, Group], record: dict[str, Any], parent: Board, force: bool) -> list[str]:
    """Refuse a group of one row that moves estimates more than MAX_ONE_ROW_MOVE× (``force``: accept it, noted)."""
    notes = []
    for key, g in groups.items():
        wheres = {r.data["where"] for r in g.rows}
        before = [r["predicted_decode"] for r in record["rows_before"] if r["measured_at"] in wheres]
        after = [r["predicted_decode"] for r in record["rows"] if r["measured_at"] in wheres]
        move = _estimate_move(g, before, after)
        if len(g.rows) > 1 or move <= MAX_ONE_ROW_MOVE:
            continue
        what = (f"one row ({g.rows[0].data['where']}) moves {parent.name}'s {key} decode estimates {move:.1f}× "
                f"(more than {MAX_ONE_ROW_MOVE:g}×)")
        if not force:
            raise InputError(what, "add a second row, of another model or context, to check it, or pass --force "
                                   "to accept one row")
        notes.append(f"{what}: accepted with --force")
    return notes


def profile(parent: Board, groups: dict[str, Group], overheads: dict, name: str, where: str) -> dict[str, Any]:
    """The parent's profile with the fitted constants inline (no calibration record yet)."""
    data = parent.model_dump(mode="json", exclude={"origin", "calibration"})
    data["name"], data["title"] = name, f"{parent.title} (calibrated from measurements)"
    bw_board = parent.bandwidth_gbps.value * 1e9
    for key, g in groups.items():
        rt, fk = key.split("/", 1)
        data["runtimes"][rt]["speed"][fk] = _constants(
            g.t0_s, g.bw / bw_board, {k: g.prefill[k] for k in PREFILL_KEYS}, f"user calibration ({where}; {g.how})",
            _in_sample_error(g), f"user calibration: in-sample on {len(g.rows)} row(s), not left out")
    for rt, r in parent.runtimes.items():
        scales = [g.scale for k, g in groups.items() if k.startswith(rt + "/") and g.scale]
        if not scales:
            continue
        s = statistics.median(scales)
        for name_ in r.schemes:
            sc = normalize_scheme(name_)
            fk = planner.format_key(sc)
            if fk in data["runtimes"][rt]["speed"] and f"{rt}/{fk}" in groups:
                continue
            consts = planner.speed_constants(parent, rt, sc).consts
            if consts:
                frac = speed.effective_bandwidth(consts, bw_board) / bw_board
                data["runtimes"][rt]["speed"][fk] = _constants(
                    consts["t0_ms"] / 1000, min(MAX_FRACTION, frac * s), {k: consts.get(k) for k in PREFILL_KEYS},
                    f"user calibration ({where}; no row for {fk}: the parent's bandwidth × {s:.3f}, the median scale "
                    f"of the {rt} rows)", None, f"user calibration: no row for {fk}, not validated")
    for rt, (mib, wheres) in overheads.items():
        data["runtimes"][rt]["overhead_mib"] = {
            "value": round(mib, 1), "source": f"user calibration ({where}): median of measured peak memory − planned "
                                              f"weights, KV cache and activations over {len(wheres)} row(s)"}
    return data


def row_errors(rows: list[Row], board: Board) -> list[dict[str, Any]]:
    """Each row's measured figures against what ``board`` predicts (abs % errors)."""
    out = []
    for r in rows:
        d = r.data
        rec = {k: d[k] for k in ("model", "quant", "prompt", "ctx", "mem_ctx", "decode", "ttft_ms", "mem_mib")
               if k in d}
        rec.update(runtime=r.runtime, measured_at=d["where"])
        rec.update(predict(r, board))
        out.append(rec)
    return out


def predict(r: Row, board: Board) -> dict[str, Any]:
    d = r.data
    p = planner.plan(r.spec, board, quant=r.scheme.name, ctx=d["ctx"], runtime=r.runtime, suggest=False)
    dec = p.estimates.decode_tokens_per_s
    out: dict[str, Any] = {"predicted_decode": dec,
                           "decode_error_pct": round((dec - d["decode"]) / d["decode"] * 100, 2) if dec else None}
    if d.get("mem_mib"):
        pm = p if "mem_ctx" not in d else planner.plan(r.spec, board, quant=r.scheme.name, ctx=d["mem_ctx"],
                                                       runtime=r.runtime, suggest=False)
        bd = pm.breakdown
        mem = (bd["weights"] + bd["kv_cache"] + bd["activations"] + bd["runtime"]) / MIB
        out.update(predicted_mem_mib=round(mem, 1), mem_error_pct=round((mem - d["mem_mib"]) / d["mem_mib"] * 100, 2))
    return out


def calibrate(rows: list[dict[str, Any]], parent: Board, name: str | None = None,
              where: str = "measurements", force: bool = False) -> tuple[Board, dict[str, Any], list[str]]:
    """(the calibrated Board, its profile as a dict to write, notes). ``force``: accept a single row that moves
    the estimates more than MAX_ONE_ROW_MOVE× (refused otherwise)."""
    if parent.bandwidth_gbps is None:
        raise InputError(f"board {parent.name} claims no memory bandwidth: there is no speed model to calibrate",
                         "calibrate a board profile that gives bandwidth_gbps")
    prepared, notes = prepare(rows, parent)
    by_key: dict[str, list[Row]] = {}
    for r in prepared:
        by_key.setdefault(r.key, []).append(r)
    for group in by_key.values():
        check_consistent(group)
    groups = {k: fit_group(v, parent) for k, v in by_key.items()}
    name = name or f"{parent.name}-calibrated"
    data = profile(parent, groups, overhead_mib(prepared, parent), name, where)
    board = board_from_dict(data, "calibrated profile")
    record = {
        "parent": parent.name, "parent_origin": parent.origin, "source": where,
        "groups": {k: {"fit": g.how, "trust": trust(g), "rows": len(g.rows), "t0_ms": round(g.t0_s * 1000, 4),
                       "bw_eff_gbps": round(g.bw / 1e9, 3),
                       "bandwidth_scale_vs_parent": round(g.scale, 4) if g.scale else None,
                       "prefill": {k[len("prefill_"):]: v for k, v in g.prefill.items()}}
                   for k, g in groups.items()},
        "rows": row_errors(prepared, board), "rows_before": row_errors(prepared, parent), "notes": notes,
    }
    notes += check_one_row_moves(groups, record, parent, force)
    data["calibration"] = record
    board.calibration = record
    return board, data, notes
