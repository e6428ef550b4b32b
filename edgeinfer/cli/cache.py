"""The ``cache`` command: what edgeinfer's cache holds on disk, and clearing it (``edgeinfer.contract.cache``)."""

from __future__ import annotations

from typing import Any

import click

from edgeinfer.cli.output import console, emit
from edgeinfer.contract import cache
from edgeinfer.errors import InputError


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


@click.group("cache", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
@click.pass_context
def cache_cmd(ctx: click.Context, as_json: bool) -> None:
    """Where the cache is ($EDGEINFER_CACHE_DIR) and what each area of it takes on disk.

    After each conversion the conversions (areas deploy, artifacts, paged) are kept under $EDGEINFER_CACHE_MAX_GB
    (default 50; `off`: no bound), the least recently used removed first."""
    if ctx.invoked_subcommand is not None:
        return
    rows = cache.usage()
    emit({"root": str(cache.root()), "areas": rows, "bytes": sum(r["bytes"] for r in rows),
          "conversions_bytes": sum(r["bytes"] for r in rows if r["rebuilt"]), "max_bytes": cache.max_bytes()},
         as_json, _render)


def _render(d: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    if not d["areas"]:
        con.print(f"{d['root']}: empty")
        return
    bound = "no bound" if d["max_bytes"] is None else f"bound {_mb(d['max_bytes'])}"
    con.print(f"{d['root']}: {_mb(d['bytes'])}; conversions {_mb(d['conversions_bytes'])} ({bound}, "
              f"${cache.MAX_ENV})", soft_wrap=True)
    t = Table(show_header=True, header_style="bold")
    for name, justify in (("area", "left"), ("entries", "right"), ("on disk", "right"), ("`cache clear`", "left")):
        t.add_column(name, justify=justify, no_wrap=True)
    for r in d["areas"]:
        t.add_row(r["area"], str(r["entries"]), _mb(r["bytes"]), "yes" if r["rebuilt"] else "only by name")
    con.print(t)


@cache_cmd.command("clear")
@click.argument("areas", nargs=-1)
@click.option("--older-than", "older_than", type=click.FloatRange(min=0), default=None, metavar="DAYS",
              help="Only entries not built or used in the last DAYS days.")
@click.option("--to", "to_gb", type=float, default=None, metavar="GB",
              help="Only the least recently used conversions, until they take at most GB (10^9 bytes) on disk.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print only JSON.")
def clear_cmd(areas: tuple[str, ...], older_than: float | None, to_gb: float | None, dry_run: bool,
              as_json: bool) -> None:
    """Remove the cached conversions (areas deploy, artifacts, paged: rebuilt when next needed), or the AREAS named
    (`edgeinfer cache` lists them). An entry a running process is building is left alone."""
    if to_gb is not None:
        if areas or older_than is not None:
            raise InputError("--to shrinks the conversions to a size: give it without AREAS and --older-than")
        if not 0 <= to_gb < float("inf"):
            raise InputError(f"--to is a size in GB, 0 or more; got {to_gb:g}")
        emit(cache.shrink(int(to_gb * 10**9), dry_run=dry_run), as_json, _render_shrunk)
        return
    present = cache.areas()
    unknown = [a for a in areas if a not in present]
    if unknown:
        raise InputError(f"no cache area {unknown[0]!r} in {cache.root()}",
                         f"name one of: {', '.join(present) or 'none (the cache is empty)'}")
    result = cache.clear(list(areas) or [a for a in cache.REBUILT if a in present], dry_run,
                         None if older_than is None else older_than * 86400)
    emit(result, as_json, _render_cleared)


def _render_cleared(r: dict[str, Any]) -> None:
    verb = "would remove" if r["dry_run"] else "removed"
    since = "" if r["older_than_s"] is None else f" not used in {r['older_than_s'] / 86400:g} days"
    click.echo(f"{verb} {r['removed_entries']} entries{since} of {', '.join(r['areas']) or 'no area'}: "
               f"{_mb(r['freed_bytes'])}")
    for b in r["busy"]:
        click.echo(f"left {b}: a running process is building it", err=True)


def _render_shrunk(r: dict[str, Any]) -> None:
    verb = "would remove" if r["dry_run"] else "removed"
    click.echo(f"{verb} {len(r['removed'])} least recently used conversions, {_mb(r['freed_bytes'])}: "
               f"{_mb(r['bytes'])} {'would be' if r['dry_run'] else 'are'} left (--to {_mb(r['max_bytes'])})")
    for b in r["busy"]:
        click.echo(f"left {b}: a running process is building it", err=True)
    for e, err in r["failed"]:
        click.echo(f"could not remove {e}: {err}", err=True)
