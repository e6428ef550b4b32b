"""``edgeinfer ray-resources`` and ``edgeinfer ray-node``: this machine as a node of a Ray fleet (docs/fleet.md)."""

from __future__ import annotations

import shlex
from typing import Any

import click

from edgeinfer import errors
from edgeinfer.cli.output import console, emit


def _render_resources(report: dict[str, Any]) -> None:
    out = console()
    if not report["resources"]:
        out.print("no accelerator found: this node offers only CPUs to a fleet (see 'edgeinfer doctor')")
    for acc in report["accelerators"]:
        memory = f", {acc['memory_bytes'] / 2**30:.1f} GiB each" if acc["memory_bytes"] else ""
        out.print(f"{acc['resource']}: {acc['count']}  ({acc['backend']}, from {acc['source']}{memory})")
    for key, value in report["labels"].items():
        out.print(f"label {key}={value}")
    for problem in report["problems"]:
        out.print(f"problem: {problem}")


@click.command("ray-resources")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def ray_resources_cmd(as_json: bool) -> None:
    """This machine's accelerators as Ray custom resources (from the backends' probes) and node labels."""
    from edgeinfer.fleet.resources import node_resources

    emit(node_resources().to_json(), as_json, _render_resources)


@click.command("ray-node")
@click.option("--address", metavar="HEAD", help="Join the Ray cluster at HEAD (host:port); default: start a head.")
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True, help="Head node's port.")
@click.option("--num-cpus", type=click.IntRange(0), help="CPUs this node offers (default: Ray counts them).")
@click.option("--block", is_flag=True, help="Stay in the foreground until the node stops.")
@click.option("--dry-run", is_flag=True, help="Print the ray start command and exit.")
@click.pass_context
def ray_node_cmd(ctx: click.Context, address: str | None, port: int, num_cpus: int | None, block: bool,
                 dry_run: bool) -> None:
    """Start a Ray node advertising this machine's accelerators (`ray stop` stops it)."""
    from edgeinfer.fleet import node
    from edgeinfer.fleet.resources import node_resources

    cmd = node.start_command(node_resources(), address, port, num_cpus, block)
    if dry_run:
        click.echo(shlex.join(cmd))
        return
    rc = node.start(cmd)
    if rc != 0:
        click.echo(f"error: ray start exited {rc} (its output above says why)", err=True)
        ctx.exit(errors.UNAVAILABLE)


def _render_fleet(report: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(show_header=True, header_style="bold", title="fleet plan (replicas per node × nodes)")
    for col in ("model", "board", "fits", "replicas/node", "total", "GiB/replica", "reason"):
        t.add_column(col, overflow="fold")
    for p in report["placements"]:
        mark = "[green]✓[/]" if p["fits"] else "[red]✗[/]"
        t.add_row(p["model"], f"{p['board']} ×{p['nodes']}", mark, str(p["replicas_per_node"]),
                  str(p["replicas_total"]), f"{p['per_replica_bytes'] / 2**30:.2f}", "; ".join(p["reasons"]))
    con = console()
    con.print(t)
    for model in report["unplaced"]:
        con.print(f"[red]✗[/] {model} fits on no node type of this fleet")


def plan_fleet(ctx: click.Context, path: str, as_json: bool) -> None:
    """``edgeinfer plan --fleet FILE``: exit 1 when a model fits nowhere."""
    from pathlib import Path

    from edgeinfer.planning.fleet import load_fleet
    from edgeinfer.planning.fleet import plan_fleet as plan

    answer = plan(load_fleet(Path(path))).to_dict()
    emit(answer, as_json, _render_fleet)
    if not answer["fits"]:
        ctx.exit(errors.NEGATIVE)
