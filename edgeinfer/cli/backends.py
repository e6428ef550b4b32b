"""``edgeinfer backends`` and ``edgeinfer doctor``: what is installed and usable, and how to fix what is not."""

from __future__ import annotations

from typing import Any

import click

from edgeinfer import errors
from edgeinfer.cli.output import console, emit
from edgeinfer.contract.names import PLUGIN_INSTALL_HINT


def _render_backends(report: dict[str, Any]) -> None:
    """One row per backend; problems are counted here and spelled out, with fixes, by `doctor`."""
    from rich.table import Table

    out = console()
    wide = out.width >= 120
    table = Table(title="edgeinfer backends")
    table.add_column("backend", no_wrap=True)
    if wide:
        table.add_column("distribution", no_wrap=True)
    table.add_column("usable", no_wrap=True)
    table.add_column("devices", overflow="fold")
    table.add_column("mode", overflow="fold", ratio=1)
    table.add_column("problems", overflow="fold")
    for b in report["backends"]:
        details = b.get("details") or {}
        n_problems = len(b.get("problems", [])) + len(details.get("warnings", []))
        row = [b["name"]] + ([f"{b['distribution']} {b['version']}"] if wide else [])
        row += ["yes" if b.get("available") else "no", ", ".join(b.get("devices", [])),
                str(details.get("mode", "")), f"{n_problems}: see doctor" if n_problems else ""]
        table.add_row(*row)
    out.print(table)
    for f in report["failed_plugins"]:
        out.print(f"plugin {f['plugin']} ({f['distribution']} {f['version']}) failed: {f['error']}")
    if not report["backends"] and not report["failed_plugins"]:
        out.print(f"no backend plugins installed; {PLUGIN_INSTALL_HINT}")


MARK = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]"}


def _render_doctor(report: dict[str, Any]) -> None:
    """Environment checks, then every backend with each problem and its fix."""
    from rich.markup import escape

    out = console()
    out.print("[bold]environment[/]")
    for c in report["environment"]:
        out.print(f"  {MARK[c['status']]} {c['name']}: {escape(c['found'])}")
        if c["fix"]:
            out.print(f"      fix: {escape(c['fix'])}")
    out.print("[bold]backends[/]")
    for b in report["backends"]:
        details = b.get("details") or {}
        devices = ", ".join(b.get("devices", [])) or "no device"
        mode = f" — {escape(str(details['mode']))}" if details.get("mode") else ""
        status = "ok" if b.get("available") and not b.get("problems") else "warn" if b.get("available") else "fail"
        out.print(f"  {MARK[status]} {b['name']} ({b['distribution']} {b['version']}): {escape(devices)}{mode}")
        for pr in b.get("problems", []):
            out.print(f"      problem: {escape(pr['message'])}")
            out.print(f"      fix: {escape(pr['fix'])}")
        for w in details.get("warnings", []):
            text = w.get("message", str(w)) if isinstance(w, dict) else str(w)
            out.print(f"      warning: {escape(text)}")
            if isinstance(w, dict) and w.get("fix"):
                out.print(f"      fix: {escape(w['fix'])}")
    for f in report["failed_plugins"]:
        out.print(f"  {MARK['fail']} plugin {f['plugin']} ({f['distribution']} {f['version']}) did not load")
        out.print(f"      problem: {escape(f['error'])}")
        others = "" if "board" in report else "; or leave it out by listing the others in EDGEINFER_PLUGINS"
        out.print(f"      fix: {escape(f['fix'])}{others}")
    missing = report.get("missing")
    if missing and not report["failed_plugins"]:
        out.print(f"  {MARK['fail']} {escape(missing['message'])}")
        out.print(f"      fix: {escape(missing['fix'])}")
    if not report["backends"] and not report["failed_plugins"] and "board" not in report:
        out.print(f"  {MARK['fail']} no backend plugins installed")
        out.print(f"      fix: {PLUGIN_INSTALL_HINT}")
    usable = ", ".join(report["usable"]) or "none"
    if "board" in report:
        out.print(f"board {report['board']}: backend {report['backend']} is "
                  f"{'usable' if report['usable'] else 'not usable here'}")
    else:
        out.print(f"usable backends: {usable}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def backends(as_json: bool) -> None:
    """List installed backends, their devices and how many problems each has."""
    from edgeinfer.run.doctor import backend_reports

    emit(backend_reports(), as_json, _render_backends)


@click.command()
@click.option("--board", "board", metavar="BOARD",
              help="Check only BOARD's backend (a board name or profile YAML): exit 3 unless it imports and its "
                   "probe finds it usable; other plugins are not imported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def doctor(ctx: click.Context, board: str | None, as_json: bool) -> None:
    """Check the environment and every backend (or BOARD's); print each problem with its fix (exit 3 if no
    backend works, or with --board if that board's backend does not)."""
    from edgeinfer.run.doctor import board_report, doctor_report

    report = board_report(board) if board is not None else doctor_report()
    emit(report, as_json, _render_doctor)
    if not report["usable"]:
        ctx.exit(errors.UNAVAILABLE)
