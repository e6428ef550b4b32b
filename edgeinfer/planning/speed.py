"""The decode-speed transfer rule and the lookup of its constants (docs/planner.md#speed-model).

Constants per ``speed_group/runtime/format``: ``{t0_ms, bw_fraction, bw_cap_gbps}`` (and the prefill's,
:mod:`.prefill`). On a board of bandwidth B
the effective bandwidth is ``min(bw_cap_gbps, bw_fraction × B)`` (no cap: no cap) and a decode step takes
``t0 + bytes_per_step / BW_eff``. Pure arithmetic on dicts: the planner, ``edgeinfer calibrate`` and
bench/fit_speed.py (leave-one-source-out) all predict through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.planning import prefill

WIDEN_FACTOR = 2.0  # an extrapolated estimate's error bar: max(WIDEN_FACTOR × the source's, WIDEN_FLOOR_PCT)
WIDEN_FLOOR_PCT = 30.0


def effective_bandwidth(c: dict, board_bw: float) -> float:
    """Bytes/s a runtime streams on a board of ``board_bw`` bytes/s: min(cap, fraction × board bandwidth)."""
    bw = c["bw_fraction"] * board_bw
    cap = c.get("bw_cap_gbps")
    return min(bw, cap * 1e9) if cap else bw


def step_seconds(c: dict, board_bw: float, bytes_per_step: float) -> float:
    return c["t0_ms"] / 1000.0 + bytes_per_step / effective_bandwidth(c, board_bw)


def widened(err: float | None) -> float | None:
    return None if err is None else round(max(WIDEN_FACTOR * err, WIDEN_FLOOR_PCT), 1)


@dataclass(frozen=True)
class Found:
    """Constants for one estimate (None: no estimate), what they are, and the error bar that goes with them."""

    consts: dict | None
    basis: str
    error_pct: float | None = None
    error_basis: str | None = None
    extrapolated: bool = False

    def prefill(self, board, params_active: int, ctx: int | None, prompt: int | None) -> dict:
        """The plan's prefill figures from these constants (:func:`.prefill.estimate`) and their left-out error,
        widened as decode's when extrapolated; {} without."""
        pre = prefill.estimate(self.consts, board, params_active, ctx, prompt)
        err, basis = (self.consts or {}).get("prefill_error_pct"), (self.consts or {}).get("prefill_error_basis")
        if pre and self.extrapolated and basis:
            basis = (f"{basis}; extrapolated" if err is None else
                     f"{basis}; extrapolated: widened to max({WIDEN_FACTOR:g} × {err:g} %, {WIDEN_FLOOR_PCT:g} %)")
            err = widened(err)
        return {**pre, "prefill_error_pct": err, "prefill_error_basis": basis} if pre else {}


def _rows(c: dict) -> int:
    return int(c.get("n_rows") or 0)


def _several_sources(c: dict) -> bool:
    """Constants carried to another accelerator generation must rest on more than one publication: one
    source's figure on another chip is a guess (a 310P eager row put a 910B at 1/13 of its measured speed)."""
    return len(c.get("sources") or ()) >= 2


def _extrapolated(c: dict, key: str, label: str) -> Found:
    err = c.get("error_pct")
    if err is None:
        eb = f"{label}, whose constants have no left-out error ({c.get('error_basis') or 'not validated'})"
    else:
        eb = (f"{label}: widened to max({WIDEN_FACTOR:g} × {err:g} %, {WIDEN_FLOOR_PCT:g} %) "
              f"from {key}'s left-out error")
    return Found(c, f"{label} ({key}, {_rows(c)} row(s))", widened(err), eb, extrapolated=True)


def lookup(table: dict, group: str | None, runtime: str, fk: str) -> Found:
    """``group/runtime/fk`` → ``*/runtime/fk`` (the runtime fitted across groups) → the group's and runtime's
    format with the most rows → the runtime's format with the most rows across groups; each fallback labelled
    "extrapolated" with a widened error bar, and the cross-group ones only from constants of several sources."""
    if not group:
        return Found(None, f"no speed group for runtime {runtime} on this board")
    key = f"{group}/{runtime}/{fk}"
    if key in table:
        c = table[key]
        return Found(c, f"fitted on {_rows(c)} measured row(s) ({key})", c.get("error_pct"), c.get("error_basis"))
    star = f"*/{runtime}/{fk}"
    if star in table and _several_sources(table[star]):
        return _extrapolated(table[star], star, f"extrapolated from other {runtime} boards")
    same = sorted((k for k in table if k.startswith(f"{group}/{runtime}/")), key=lambda k: (-_rows(table[k]), k))
    if same:
        return _extrapolated(table[same[0]], same[0], f"extrapolated from {same[0].split('/', 2)[2]}")
    other = sorted((k for k in table if k.startswith(f"*/{runtime}/") and _several_sources(table[k])),
                   key=lambda k: (-_rows(table[k]), k))
    if other:
        fmt = other[0].split("/", 2)[2]
        return _extrapolated(table[other[0]], other[0], f"extrapolated from {fmt} on other {runtime} boards")
    elsewhere = sorted({g for k in table for g, r, _ in [k.split("/", 2)] if r == runtime and g != "*"})
    if elsewhere:
        return Found(None, f"{runtime} is measured by one source only, on {', '.join(elsewhere)}, not on {group}: "
                           "not carried to another accelerator; measure it here and run `edgeinfer calibrate`")
    return Found(None, f"no measured rows for {runtime} with {fk} on any board, nor for {runtime} on {group}: "
                       "measure some and run `edgeinfer calibrate`")


def inline(c: dict, runtime: str, fk: str) -> Found:
    """A board profile's own constants (a calibration): their basis is their source."""
    eb = c.get("error_basis") or "the board profile's own constants: no left-out error"
    return Found(c, f"{c.get('source', 'board profile')} constants for {runtime}/{fk}", c.get("error_pct"), eb)
