"""The ``edgeinfer`` command line: each command a thin shell over a library function.

Conventions: user errors print one line on stderr and exit 2 (no traceback
unless --debug); ``--json`` puts only JSON on stdout; colour only on a terminal.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__, errors
from .errors import EdgeInferError, InputError


class EdgeInferGroup(click.Group):
    """Turns EdgeInferError into one line + exit code; keeps tracebacks for --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EdgeInferError as e:
            if _debug(ctx):
                raise
            click.echo(f"error: {e.one_line()}", err=True)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except Exception as e:
            if _debug(ctx):
                raise
            first = (str(e).strip().splitlines() or [""])[0]
            click.echo(
                f"error: internal error {type(e).__name__}: {first} (rerun with --debug for the traceback "
                "and report it)",
                err=True,
            )
            ctx.exit(errors.UNAVAILABLE)


def _debug(ctx: click.Context) -> bool:
    return bool(ctx.find_root().params.get("debug")) or os.environ.get("EDGEINFER_DEBUG") == "1"


@click.group(cls=EdgeInferGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="edgeinfer")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Plan, convert, run and serve the same model on edge NPUs.

    \b
    Exit codes: 0 ok; 1 negative verdict (does not fit, check failed);
                2 usage or input error; 3 backend or device unavailable.
    """


# --- output helpers ---------------------------------------------------------------------------


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (stdout holds nothing else) or through ``render``."""
    if as_json:
        print_json(data)
    else:
        render(data)


# --- backends / doctor -----------------------------------------------------------------------


def backend_reports(probe: bool = True) -> dict[str, Any]:
    """Every backend with its plugin, version and probe; every plugin that failed to load."""
    from . import plugins
    from .backend import Probe, Problem

    reg = plugins.registry()
    rows = []
    for name in sorted(reg.backends):
        entry = reg.backends[name]
        row: dict[str, Any] = {
            "name": name,
            "plugin": entry.plugin.name,
            "distribution": entry.plugin.distribution,
            "version": entry.plugin.version,
        }
        if probe:
            try:
                p = entry.cls().probe()
            except Exception as e:  # a probe must never take the whole listing down
                p = Probe(
                    available=False,
                    problems=[Problem(f"probe failed: {type(e).__name__}: {e}", "run with --debug and report it")],
                )
            row.update(p.to_json())
        rows.append(row)
    failed = [
        {"plugin": p.name, "distribution": p.distribution, "version": p.version, "error": p.error}
        for p in reg.plugins.values()
        if p.error
    ]
    return {"backends": rows, "failed_plugins": failed}


def _render_backends(report: dict[str, Any], hints: bool) -> None:
    from rich.table import Table

    out = console()
    table = Table(title="edgeinfer backends")
    for col in ("backend", "distribution", "available", "devices", "problems"):
        table.add_column(col)
    for b in report["backends"]:
        problems = "; ".join(
            p["message"] + (f" → {p['fix']}" if hints else "") for p in b.get("problems", [])
        )
        table.add_row(
            b["name"],
            f"{b['distribution']} {b['version']}",
            "yes" if b.get("available") else "no",
            ", ".join(b.get("devices", [])),
            problems,
        )
    out.print(table)
    for f in report["failed_plugins"]:
        out.print(f"plugin {f['plugin']} ({f['distribution']} {f['version']}) failed: {f['error']}")
    if not report["backends"] and not report["failed_plugins"]:
        out.print("no backend plugins installed; try: pip install edgeinfer-onnxruntime")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def backends(as_json: bool) -> None:
    """List installed backends, their devices and problems."""
    emit(backend_reports(), as_json, lambda r: _render_backends(r, hints=False))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Probe every backend and say how to fix what is wrong (exit 3 if none is usable)."""
    report = backend_reports()
    report["usable"] = [b["name"] for b in report["backends"] if b.get("available")]
    emit(report, as_json, lambda r: _render_backends(r, hints=True))
    if not report["usable"]:
        ctx.exit(errors.UNAVAILABLE)


# --- run ---------------------------------------------------------------------------------------


def parse_inputs(specs: tuple[str, ...]) -> dict[str, Any]:
    """``NAME=FILE.npy`` pairs → arrays (errors name the bad pair)."""
    import numpy as np

    feeds = {}
    for item in specs:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input {item!r} is not NAME=FILE.npy")
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--input {name}: file not found: {path}")
        try:
            feeds[name] = np.load(path, allow_pickle=False)
        except Exception as e:
            raise InputError(f"--input {name}: {path} is not a readable .npy file ({e})") from None
    return feeds


def write_outputs(outputs: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every output as ``out_dir/<name>.npy``, all or nothing."""
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".edgeinfer-") as tmp:
        for name, arr in outputs.items():
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            p = Path(tmp) / f"{safe}.npy"
            np.save(p, arr)
            staged.append((p, out_dir / p.name))
        for src, dst in staged:
            os.replace(src, dst)
    return [dst for _, dst in staged]


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--input", "-i", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input tensor.")
@click.option("--backend", "-b", help="Backend to run on (default: the model's native backend).")
@click.option("--device", "-d", help="Device of the backend (e.g. CPU, NPU).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Write outputs as DIR/<name>.npy.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def run(
    model: Path, inputs: tuple[str, ...], backend: str | None, device: str | None, out_dir: Path | None, as_json: bool
) -> None:
    """Run MODEL once on the given inputs."""
    import numpy as np

    from .loading import load

    feeds = parse_inputs(inputs)
    t0 = time.perf_counter()
    session = load(model, backend=backend, device=device)
    load_s = time.perf_counter() - t0
    with session:
        t1 = time.perf_counter()
        outputs = session.run(feeds)
        run_s = time.perf_counter() - t1
    written = write_outputs(outputs, out_dir) if out_dir else []
    report = {
        "model": str(model),
        "backend": session.backend_name,
        "device": session.device,
        "outputs": [
            {"name": k, "shape": list(np.shape(v)), "dtype": np.asarray(v).dtype.name} for k, v in outputs.items()
        ],
        "timing_ms": {"load": load_s * 1e3, "run": run_s * 1e3},
        "written": [str(p) for p in written],
    }

    def render(r: dict[str, Any]) -> None:
        out = console()
        out.print(f"{r['model']} on {r['backend']} ({r['device']}): run {r['timing_ms']['run']:.1f} ms")
        for o in r["outputs"]:
            out.print(f"  {o['name']}: {o['dtype']} {o['shape']}")
        for p in r["written"]:
            out.print(f"  wrote {p}")

    emit(report, as_json, render)


# --- start-up ------------------------------------------------------------------------------------


def _attach_optional_commands() -> None:
    """Commands from core modules that may not exist yet, and from plugins."""
    from . import plugins

    try:
        from .cli_plan import boards_cmd, plan_cmd

        cli.add_command(plan_cmd)
        cli.add_command(boards_cmd)
    except ImportError:
        pass
    try:
        from .serve.cli import serve_cmd

        cli.add_command(serve_cmd)
    except ImportError:
        pass
    plugins.registry().add_commands(cli)


def main() -> None:
    _attach_optional_commands()
    cli(prog_name="edgeinfer")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
