"""The ``edgeinfer`` command line: each command a thin shell over a library function.

Conventions: user errors print one line on stderr and exit 2 (no traceback
unless --debug); ``--json`` puts only JSON on stdout; colour only on a terminal.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from edgeinfer import __version__, errors
from edgeinfer.errors import EdgeInferError, InputError


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
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (implies --verbose).")
@click.option("--verbose", "-v", is_flag=True, help="Show third-party logs, warnings and progress bars.")
def cli(debug: bool, verbose: bool) -> None:
    """Plan, convert, run and serve the same model on edge NPUs.

    \b
    Exit codes: 0 ok; 1 negative verdict (does not fit, check failed);
                2 usage or input error; 3 backend or device unavailable;
                130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """
    from edgeinfer.progress import VERBOSE_ENV, quiet_third_party

    if debug or verbose:
        os.environ[VERBOSE_ENV] = "1"
    else:
        quiet_third_party()


# --- output helpers ---------------------------------------------------------------------------


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    click.echo(json.dumps(_json_safe(data), indent=2, default=str, allow_nan=False))


def _json_safe(data: Any) -> Any:
    """NaN / Inf → null: bare ``NaN`` is not JSON, and a script reading us would choke on it."""
    if isinstance(data, float):
        return data if data == data and data not in (float("inf"), float("-inf")) else None
    if isinstance(data, dict):
        return {k: _json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_json_safe(v) for v in data]
    return data


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (stdout holds nothing else) or through ``render``."""
    if as_json:
        print_json(data)
    else:
        render(data)


# --- backends / doctor -----------------------------------------------------------------------


def backend_reports(probe: bool = True) -> dict[str, Any]:
    """Every backend with its plugin, version and probe; every plugin that failed to load."""
    from edgeinfer.contract import registry as plugins
    from edgeinfer.contract.backend import Probe, Problem

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


PLUGIN_INSTALL_HINT = "from a clone of edgeinfer: pip install ./plugins/onnxruntime (or ./plugins/openvino ...)"
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
        out.print(f"      fix: reinstall it (pip install --force-reinstall {f['distribution']}), or leave it out "
                  "with EDGEINFER_PLUGINS")
    if not report["backends"] and not report["failed_plugins"]:
        out.print(f"  {MARK['fail']} no backend plugins installed")
        out.print(f"      fix: {PLUGIN_INSTALL_HINT}")
    usable = ", ".join(report["usable"]) or "none"
    out.print(f"usable backends: {usable}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def backends(as_json: bool) -> None:
    """List installed backends, their devices and how many problems each has."""
    emit(backend_reports(), as_json, _render_backends)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the environment and every backend; print each problem with its fix (exit 3 if no backend works)."""
    from edgeinfer.run.doctor import environment_checks

    report = backend_reports()
    report["environment"] = [c.to_json() for c in environment_checks()]
    report["usable"] = [b["name"] for b in report["backends"] if b.get("available")]
    emit(report, as_json, _render_doctor)
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
        if name in feeds:
            raise InputError(f"--input {name} is given twice; give each input once")
        path = Path(file)
        if not path.is_file():
            raise InputError(f"--input {name}: file not found: {path}")
        try:
            arr = np.load(path, allow_pickle=False)  # object arrays raise: nothing is unpickled
        except Exception as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise InputError(f"--input {name}: {path} is not a readable .npy file ({why})") from None
        if not isinstance(arr, np.ndarray):
            arr.close()
            raise InputError(f"--input {name}: {path} is a .npz archive; pass one .npy array per input")
        feeds[name] = arr
    return feeds


def token_id_limits(model: Path, bundle: Any) -> dict[str, int]:
    """Integer inputs that index an embedding table → its row count (from the ONNX graph,
    else the bundle's tokenizer); empty when the model does not tell."""
    from edgeinfer.planning.models.onnx import index_limits

    files = [a for a in bundle.artifacts if a.suffix == ".onnx"] if bundle else [model] if model.suffix == ".onnx" else []
    limits: dict[str, int] = {}
    for f in files[:1]:
        limits.update(index_limits(f))
    if bundle is not None and bundle.manifest.text is not None and "input_ids" not in limits:
        limits["input_ids"] = bundle._tokenizer.get_vocab_size()
    return limits


def check_token_ids(feeds: dict[str, Any], limits: dict[str, int]) -> None:
    """Refuse token ids outside [0, vocabulary): a backend would read out of bounds or return garbage."""
    for name, rows in limits.items():
        arr = feeds.get(name)
        if arr is None or arr.dtype.kind not in "iu" or arr.size == 0:
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= rows:
            bad = lo if lo < 0 else hi
            raise InputError(f"--input {name}: id {bad} is outside the model's vocabulary [0, {rows}); "
                             "pass ids made by the model's tokenizer (or use --text)")


def write_outputs(outputs: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every output as ``out_dir/<name>.npy``, all or nothing."""
    import numpy as np

    from edgeinfer.files import temp_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    staged = []
    with temp_dir(out_dir, "outputs") as tmp:
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
@click.option("--text", "-t", "texts", multiple=True, help="Text input (bundles with a tokenizer); repeatable.")
@click.option("--backend", "-b", help="Backend to run on (default: the model's native backend).")
@click.option("--device", "-d", help="Device of the backend (e.g. CPU, NPU).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Write outputs as DIR/<name>.npy.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x128",
              help="Static input shape when the model is converted first (e.g. ONNX for rknn); repeatable.")
@click.option("--paging", "window", type=int, metavar="W", help="Run layer-paged: keep at most W segments loaded.")
@click.option("--segments", type=int, metavar="N", help="With --paging: split into N segments at layer boundaries.")
@click.option("--cut", "cuts", multiple=True, metavar="TENSOR", help="With --paging: cut at this tensor (repeatable).")
@click.option("--no-prefetch", is_flag=True, help="With --paging: load segments in line, not in the background.")
def run(
    model: Path,
    inputs: tuple[str, ...],
    texts: tuple[str, ...],
    backend: str | None,
    device: str | None,
    out_dir: Path | None,
    as_json: bool,
    shapes: tuple[str, ...] = (),
    window: int | None = None,
    segments: int | None = None,
    cuts: tuple[str, ...] = (),
    no_prefetch: bool = False,
) -> None:
    """Run MODEL (a file or a bundle) once on the given inputs or texts."""
    import numpy as np

    from edgeinfer.run.bundle import Bundle, is_bundle, run_padded
    from edgeinfer.build.golden import non_finite
    from edgeinfer.run.loading import load

    if not model.exists():
        raise InputError(f"model file not found: {model}")
    if texts and inputs:
        raise InputError("give either --text or --input, not both")
    if not texts and not inputs:
        raise InputError("nothing to run: pass --input NAME=FILE.npy (or --text for text bundles)")
    if out_dir is not None:
        from edgeinfer.files import check_output_dir

        check_output_dir(out_dir, "--out")
    bundle = Bundle.open(model) if is_bundle(model) else None
    if texts and bundle is None:
        raise InputError("--text needs a bundle with a tokenizer (made by `edgeinfer deploy` from a HF directory)")
    feeds = bundle.tokenize(list(texts)) if texts else parse_inputs(inputs)
    if not texts:
        check_token_ids(feeds, token_id_limits(model, bundle))
    t0 = time.perf_counter()
    if window is not None or segments is not None or cuts:
        from edgeinfer.run.paged import open_paged

        for opt, value in (("--paging", window), ("--segments", segments)):
            if value is not None and value < 1:
                raise InputError(f"{opt} must be at least 1, got {value}")
        if window is None or bundle is not None:
            raise InputError("--segments/--cut go with --paging W on an .onnx model (a paged bundle pages by itself)")
        session = open_paged(model, backend=backend, device=device, window=window, segments=segments,
                             cuts=list(cuts), prefetch=not no_prefetch)
    else:
        from edgeinfer.build.deploy import parse_shapes

        extra = {"shapes": parse_shapes(shapes)} if shapes else {}
        session = load(model, backend=backend, device=device, **extra)
    load_s = time.perf_counter() - t0
    with session:
        t1 = time.perf_counter()
        outputs = run_padded(session, feeds) if bundle else session.run(feeds)
        run_s = time.perf_counter() - t1
    if texts and bundle.manifest.text.pooling != "none":
        outputs = {**outputs, "embeddings": bundle.embed(outputs, feeds)}
    written = write_outputs(outputs, out_dir) if out_dir else []
    report: dict[str, Any] = {
        "model": str(model),
        "backend": session.backend_name,
        "device": session.device,
        "outputs": [
            {"name": k, "shape": list(np.shape(v)), "dtype": np.asarray(v).dtype.name, "non_finite": non_finite(v)}
            for k, v in outputs.items()
        ],
        "timing_ms": {"load": load_s * 1e3, "run": run_s * 1e3},
        "written": [str(p) for p in written],
    }
    for o in report["outputs"]:
        if o["non_finite"]:
            click.echo(f"warning: output {o['name']} holds {o['non_finite']} NaN/Inf values (reported as null in --json)",
                       err=True)
    if hasattr(session, "stats"):  # a paged session: page-in times and resident bytes
        report["paging"] = session.stats()
    if "embeddings" in outputs:
        report["embeddings"] = np.round(outputs["embeddings"], 6).tolist()

    def render(r: dict[str, Any]) -> None:
        out = console()
        out.print(f"{r['model']} on {r['backend']} ({r['device']}): run {r['timing_ms']['run']:.1f} ms")
        for o in r["outputs"]:
            out.print(f"  {o['name']}: {o['dtype']} {o['shape']}")
        for i, vec in enumerate(r.get("embeddings", [])):
            head = ", ".join(f"{x:+.4f}" for x in vec[:6])
            out.print(f"  embedding[{i}] ({len(vec)} dims): [{head}, …]")
        for p in r["written"]:
            out.print(f"  wrote {p}")

    emit(report, as_json, render)


# --- deploy / golden / bench ---------------------------------------------------------------------


@cli.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--board", required=True, help="Board name (see `edgeinfer boards`) or a board YAML file.")
@click.option("--quant", "-q", help="Scheme: fp16 (default), w8a8/int8, w8a16, w4a16, ... as the board supports.")
@click.option("--calib", type=click.Path(path_type=Path), help="Calibration data: .txt (one sample a line), .npz or dir.")
@click.option("--golden-inputs", type=click.Path(path_type=Path), help="Held-out samples for the golden check.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x128", help="Static input shape; repeatable.")
@click.option("--threshold", type=float, help="Minimum cosine vs onnxruntime fp32 (default 0.99; 0.98 for w8a8/int8).")
@click.option("--max-samples", default=128, show_default=True, help="Calibration samples used at most.")
@click.option("--force", is_flag=True, help="Deploy even when the plan says it does not fit.")
@click.option("--no-cache", is_flag=True, help="Convert again even if a cached conversion exists.")
@click.option("--option", "backend_options", multiple=True, metavar="KEY=VALUE",
              help="Backend convert option, value parsed as JSON when it can be (e.g. auto_hybrid=true); repeatable.")
@click.option("--paging", type=int, metavar="W", help="Segmented bundle for layer-paged runs: W segments resident.")
@click.option("--segments", type=int, metavar="N", help="With --paging: split into N segments at layer boundaries.")
@click.option("--cut", "cuts", multiple=True, metavar="TENSOR", help="With --paging: cut at this tensor (repeatable).")
@click.option("-o", "--out", "out", required=True, type=click.Path(path_type=Path), help="Bundle directory to write.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def deploy(
    model: Path, board: str, quant: str | None, calib: Path | None, golden_inputs: Path | None,
    shapes: tuple[str, ...], threshold: float | None, max_samples: int, force: bool, no_cache: bool,
    backend_options: tuple[str, ...], paging: int | None, segments: int | None, cuts: tuple[str, ...], out: Path,
    as_json: bool,
) -> None:
    """Convert MODEL for BOARD, check it against onnxruntime fp32, and write a bundle."""
    from edgeinfer.build import deploy as deploy_mod
    from edgeinfer.progress import Progress

    progress = Progress(enabled=None if not as_json else False)
    result = deploy_mod.deploy(
        model, board, out, quant=quant, calib=calib, golden_inputs=golden_inputs,
        shapes=deploy_mod.parse_shapes(shapes), force=force, threshold=threshold, max_samples=max_samples,
        options=parse_options(backend_options), progress=progress, use_cache=not no_cache, paging=paging, segments=segments, cuts=list(cuts) or None,
    )
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)

    def render(r: dict[str, Any]) -> None:
        from edgeinfer.build.golden import summary_line

        out_c = console()
        how = " (cached conversion reused)" if r["cached"] else ""
        out_c.print(f"bundle {r['bundle']}: {r['backend']} {r['scheme']} for {r['board']}{how}")
        out_c.print("  " + summary_line(r["golden"]) + f" (ran on {r['golden'].get('device', '?')})")

    emit(result.to_json(), as_json, render)


@cli.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--inputs", type=click.Path(path_type=Path), help="New samples (.txt/.npz/dir); needs --reference.")
@click.option("--reference", type=click.Path(path_type=Path), help="fp32 ONNX to compare against for --inputs.")
@click.option("--threshold", type=float, help="Minimum cosine (default: the bundle's).")
@click.option("--device", "-d", help="Device of the backend.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def golden(
    ctx: click.Context, bundle_dir: Path, inputs: Path | None, reference: Path | None, threshold: float | None,
    device: str | None, as_json: bool,
) -> None:
    """Re-run the golden check of BUNDLE on this machine (exit 1 when it fails)."""
    from edgeinfer.build import golden as golden_mod
    from edgeinfer.run.bundle import Bundle, run_padded
    from edgeinfer.build.calibration import load_samples
    from edgeinfer.build.deploy import load_saved_samples
    from edgeinfer.run.loading import load

    if threshold is not None and not (math.isfinite(threshold) and -1 <= threshold <= 1):
        raise InputError(f"--threshold is a minimum cosine between -1 and 1, got {threshold}")
    b = Bundle.open(bundle_dir, verify="full")
    limit = threshold if threshold is not None else (b.manifest.golden or {}).get("threshold", 0.99)
    if inputs:
        if reference is None:
            raise InputError("--inputs needs --reference MODEL.onnx (the fp32 model to compare against)")
        tok = (lambda texts: b.tokenize(texts)) if b.manifest.text else None
        samples = load_samples(inputs, b.manifest.inputs, tok)
        if not samples:
            raise InputError(f"--inputs {inputs} holds no samples; pass a .txt with lines, or a non-empty .npz")
        with load(reference, backend="onnxruntime") as ref:
            expected = [run_padded(ref, s) for s in samples]
    else:
        samples = load_saved_samples(b.file("golden/inputs.npz", "golden inputs"))
        expected = load_saved_samples(b.file("golden/expected.npz", "golden reference outputs"))
    with b.load(device=device) as session:
        got = [run_padded(session, s) for s in samples]
        report = golden_mod.compare(expected, got, samples, limit)
        report["device"] = session.device
    report["bundle"] = str(b.path)
    emit(report, as_json, lambda r: console().print(golden_mod.summary_line(r) + f" (ran on {r['device']})"))
    if not report["passed"]:
        click.echo(f"error: golden check failed; worst: {golden_mod.worst_samples_line(report)}", err=True)
        ctx.exit(errors.NEGATIVE)


@cli.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def verify(ctx: click.Context, bundle_dir: Path, as_json: bool) -> None:
    """Check every file of BUNDLE against the sizes and sha256 in its manifest (exit 2 when any differs)."""
    from edgeinfer.run.bundle import verify as verify_bundle

    report = verify_bundle(bundle_dir)

    def render(r: dict[str, Any]) -> None:
        if r["ok"]:
            console().print(f"bundle {r['bundle']}: {r['files']} files, {r['bytes']} bytes, all match the manifest")
        for p in r["problems"]:
            click.echo(f"  {p}")

    emit(report, as_json, render)
    if not report["ok"]:
        n = len(report["problems"])
        click.echo(f"error: bundle {bundle_dir} is damaged: {n} file{'s differ' if n > 1 else ' differs'} from the manifest; "
                   "deploy the model again", err=True)
        ctx.exit(errors.USAGE)


def parse_options(items: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; VALUE is JSON when it parses (true, 3, [1, 2]), a string otherwise."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--option {item!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


MAX_BENCH_BATCH = 4096  # far past any edge NPU's useful batch; larger values only exhaust memory
MAX_BENCH_SEQ = 2**20
MAX_BENCH_REPEAT = 100_000


def _int_list(value: str, what: str, largest: int) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(v <= 0 for v in out):
        raise InputError(f"{what} {value!r} is not a comma-separated list of positive integers, e.g. 1,8,32")
    if max(out) > largest:
        raise InputError(f"{what} {max(out)} is larger than {largest}, the most edgeinfer bench runs")
    return out


@cli.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--batch", default="1,8,32", show_default=True, help="Batch sizes, comma-separated.")
@click.option("--seq", default=None, help="Sequence lengths for dynamic-shape bundles, comma-separated.")
@click.option("--repeat", default=20, show_default=True, help="Timed calls per case.")
@click.option("--device", "-d", help="Device of the backend.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG chart of throughput and latency.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench(
    bundle_dir: Path, batch: str, seq: str | None, repeat: int, device: str | None, plot: Path | None, as_json: bool
) -> None:
    """Latency p50/p95/p99, throughput and peak memory of BUNDLE per batch size."""
    from edgeinfer.run import benchmark
    from edgeinfer.run.bundle import Bundle
    from edgeinfer.progress import Progress

    if not 1 <= repeat <= MAX_BENCH_REPEAT:
        raise InputError(f"--repeat must be between 1 and {MAX_BENCH_REPEAT}, got {repeat}")
    batches = _int_list(batch, "--batch", MAX_BENCH_BATCH)
    seqs: list[int | None] = list(_int_list(seq, "--seq", MAX_BENCH_SEQ)) if seq else [None]
    if plot is not None:  # before the benchmark, not after minutes of it
        from edgeinfer.files import check_output_file

        check_output_file(plot, "--plot", benchmark.PLOT_SUFFIXES)
    b = Bundle.open(bundle_dir)
    with b.load(device=device) as session:
        report = benchmark.bench(b, session, batches, seqs, repeat, progress=Progress(
            enabled=None if not as_json else False))
    if plot:
        report["plot"] = str(benchmark.plot(report, plot))

    def render(r: dict[str, Any]) -> None:
        from rich.table import Table

        t = Table(title=f"{r['bundle']} · {r['backend']} {r['scheme']} · ran on {r['device']}")
        for col in ("batch", "seq", "p50 ms", "p95 ms", "p99 ms", "samples/s", "peak RSS MiB"):
            t.add_column(col, justify="right")
        for row in r["results"]:
            lat = row["latency_ms"]
            rss = f"{row['peak_rss_bytes'] / 2**20:.0f}" if row["peak_rss_bytes"] else "-"
            t.add_row(str(row["batch"]), str(row["seq"]), f"{lat['p50']:.1f}", f"{lat['p95']:.1f}",
                      f"{lat['p99']:.1f}", f"{row['throughput_per_s']:.1f}", rss)
        console().print(t)
        if r.get("plot"):
            console().print(f"chart: {r['plot']}")

    emit(report, as_json, render)


# --- start-up ------------------------------------------------------------------------------------


_ATTACHED = False


def _attach_optional_commands() -> None:
    """Commands from core modules that may not exist yet, and from plugins (once per process)."""
    global _ATTACHED
    from edgeinfer.contract import registry as plugins

    if _ATTACHED:
        return
    _ATTACHED = True

    try:
        from edgeinfer.cli.plan import boards_cmd, plan_cmd

        cli.add_command(plan_cmd)
        cli.add_command(boards_cmd)
    except ImportError:
        pass
    try:
        from edgeinfer.serve.cli import serve_cmd

        cli.add_command(serve_cmd)
    except ImportError:
        pass
    plugins.registry().add_commands(cli)


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    return f"warning: {' '.join(str(message).split())}\n"


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise errors.Interrupted(signum)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def invoke(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` and return its exit code; every error is one line on stderr.

    Click usage errors become ``error: ... (see 'edgeinfer CMD --help')``, exit 2 (not click's
    multi-line usage block); Ctrl-C exits 130 and SIGTERM 143 (128 + signal), after the
    interrupted command removed its temporaries.
    """
    import signal

    try:
        rv = cli.main(args=argv, prog_name="edgeinfer", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else "")
        click.echo("error: missing command (see 'edgeinfer --help')", err=True)
        return errors.USAGE
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx else "edgeinfer"
        click.echo(f"error: {_one_line(e.format_message()).rstrip('.')} (see '{where} --help')", err=True)
        return errors.USAGE
    except click.ClickException as e:
        click.echo(f"error: {_one_line(e.format_message())}", err=True)
        return e.exit_code
    except (click.Abort, KeyboardInterrupt) as e:
        cause = e if isinstance(e, KeyboardInterrupt) else e.__cause__ or e.__context__
        signum = getattr(cause, "signum", signal.SIGINT)
        click.echo(f"error: interrupted ({signal.Signals(signum).name}); nothing was left behind", err=True)
        return 128 + signum
    except SystemExit as e:  # a command that exits with its verdict (plan: 1 = does not fit)
        return e.code if isinstance(e.code, int) else errors.USAGE if e.code else errors.OK
    return rv if isinstance(rv, int) else errors.OK


def main(argv: list[str] | None = None) -> None:
    import signal
    import warnings

    warnings.formatwarning = _one_line_warning  # e.g. an NPU that fell back to CPU: one line, no source echo
    signal.signal(signal.SIGTERM, _raise_interrupted)
    from edgeinfer.cli.pipes import PipeSafeStdout

    sys.stdout = PipeSafeStdout(sys.stdout)  # type: ignore[assignment]  # `edgeinfer plan … | head`: no EPIPE
    _attach_optional_commands()
    sys.exit(invoke(argv))

