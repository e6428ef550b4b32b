"""``edgeinfer calibrate``: fit a board's speed constants and runtime overhead to your own measurements
(edgeinfer.planning.calibrate) and write a board profile that ``edgeinfer plan --board PROFILE.yaml`` uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.output import console, emit


@click.command("calibrate")
@click.argument("measurements", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--board", required=True, help="The board the rows were measured on (name or YAML): the parent.")
@click.option("--output", "-o", required=True, type=click.Path(path_type=Path), help="Board profile YAML to write.")
@click.option("--name", default=None, help="Name of the calibrated board [default: BOARD-calibrated].")
@click.option("--force", is_flag=True,
              help="Accept a single row that moves the board's decode estimates more than 2× (refused otherwise).")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON (the calibration record).")
def calibrate_cmd(measurements: tuple[Path, ...], board: str, output: Path, name: str | None, force: bool,
                  as_json: bool) -> None:
    """Fit BOARD's decode speed constants (t0, effective bandwidth per runtime and scheme) and runtime memory
    overhead to MEASUREMENTS: `edgeinfer bench --json` reports of decoder bundles, or YAML/CSV rows with the
    fields of bench/data/measured_rows.yaml (model, quant, ctx, decode; optional prompt, ttft_ms, mem_mib).
    One row is trusted fully (the bandwidth is scaled to meet it); moving estimates more than 2× on one row needs
    --force or a second row. Exit 0 written, 2 bad, empty or contradictory measurements, or one row moving
    estimates more than 2× without --force."""
    import yaml

    from edgeinfer.errors import InputError
    from edgeinfer.files import check_output_file
    from edgeinfer.planning import calibrate
    from edgeinfer.planning import measurements as meas
    from edgeinfer.planning.boards import get_board

    check_output_file(output, "--output", (".yaml", ".yml"))
    if name is not None and not name.replace("-", "").replace(".", "").replace("_", "").isalnum():
        raise InputError(f"--name {name!r} is not a board name", "use lower-case letters, digits, '-', '.', '_'")
    rows, notes = meas.load(list(measurements))
    parent = get_board(board)
    where = ", ".join(p.name for p in measurements)
    b, data, more = calibrate.calibrate(rows, parent, name.lower() if name else None, where, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("# written by `edgeinfer calibrate`; plan with: edgeinfer plan MODEL --board " + str(output)
                      + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    report = {"profile": str(output), "board": b.name, **data["calibration"], "notes": notes + more}
    emit(report, as_json, _render)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def _render(r: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    con.print(f"calibrated [bold]{r['board']}[/] from {r['parent']} on {len(r['rows'])} row(s) → {r['profile']}")
    for k, g in r["groups"].items():
        scale = g["bandwidth_scale_vs_parent"]
        con.print(f"  {k}: t0 {g['t0_ms']:.2f} ms, BW_eff {g['bw_eff_gbps']:.2f} GB/s"
                  + (f" (× {scale:.3f} of the parent's)" if scale else "") + f" — {g['fit']}")
        con.print(f"    trust: {g['trust']}")
        pre = g["prefill"]
        if pre.get("factor"):
            unit = pre.get("factor_is") or "of the board's peak"
            con.print(f"    prefill: t0 {pre['t0_ms'] or 0:.1f} ms, factor {pre['factor']:.4g} {unit} — "
                      f"{pre['fit']}" + (f" (in-sample error {pre['fit_median_abs_pct_error']:g} %)"
                                         if pre.get("fit_median_abs_pct_error") is not None else ""))
    t = Table(show_header=True, header_style="bold")
    for col in ("row", "model", "quant", "ctx", "decode tok/s", "error before", "error after", "mem MiB",
                "mem error before", "after"):
        t.add_column(col, justify="right" if col not in ("row", "model", "quant") else "left", overflow="fold")
    for a, b in zip(r["rows"], r["rows_before"]):
        t.add_row(a["measured_at"].rsplit(" ", 1)[-1], a["model"], a["quant"], str(a["ctx"]), f"{a['decode']:g}",
                  _pct(b["decode_error_pct"]), _pct(a["decode_error_pct"]),
                  f"{a['mem_mib']:g}" if a.get("mem_mib") else "-", _pct(b.get("mem_error_pct")),
                  _pct(a.get("mem_error_pct")))
    con.print(t)
    for n in r["notes"]:
        con.print(f"note: {n}")
    con.print(f"plan with it: edgeinfer plan MODEL --board {r['profile']}")
