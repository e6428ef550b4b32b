"""``edgeinfer deploy``, ``golden`` and ``verify``: build a bundle, check it, check its seal."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from edgeinfer import errors
from edgeinfer.cli.output import console, emit
from edgeinfer.cli.trust import trust_remote_code_option
from edgeinfer.contract.names import ENCODER_REFERENCE
from edgeinfer.errors import InputError


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--board", required=True, help="Board name (see `edgeinfer boards`) or a board YAML file.")
@click.option("--quant", "-q", help="Scheme: w8a8/int8, w8a16, w4a16, fp16, ... as the board supports (default: as "
              "`edgeinfer plan` decides: the building backend's preference; for encoders fp16 where the backend "
              "converts it, else its default scheme).")
@click.option("--calib", type=click.Path(path_type=Path),
              help="Calibration data: .txt (one sample a line), .npz or dir.")
@click.option("--golden-inputs", type=click.Path(path_type=Path), help="Held-out samples for the golden check.")
@click.option("--ctx", type=int, help="Decoder models: context (tokens) to build and check for (default: the "
              "model's limit, at most 2048).")
@click.option("--runtime", help="Decoder models: the board runtime to build for (`edgeinfer boards show BOARD`), "
              "e.g. rkllm on RK3588/RK3576 (Rockchip's RKLLM toolkit); default: as `edgeinfer plan` decides, the "
              "board's first runtime this installation can build.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x128", help="Static input shape; repeatable.")
@click.option("--threshold", type=float,
              help=f"Minimum cosine vs {ENCODER_REFERENCE} fp32 (default 0.99; 0.98 for w8a8/int8).")
@click.option("--task-threshold", "task_thresholds", multiple=True, metavar="METRIC=VALUE",
              help="Rerankers/classifiers: a golden threshold (kendall_tau, topk_overlap, ndcg; label_agreement, "
              "max_prob_error), repeatable (defaults: docs/deploy.md#rerankers-and-classifiers).")
@click.option("--max-samples", default=128, show_default=True, help="Calibration samples used at most.")
@click.option("--force", is_flag=True, help="Deploy even when the plan says it does not fit.")
@click.option("--no-cache", is_flag=True, help="Convert again even if a cached conversion exists.")
@click.option("--board-only", is_flag=True,
              help="Leave out of the bundle what only this machine's simulator reads (e.g. each artifact's source "
                   "model), after the golden check: a smaller bundle to copy to the board, which then runs only "
                   "there.")
@click.option("--option", "backend_options", multiple=True, metavar="KEY=VALUE",
              help="Backend convert option, value parsed as JSON when it can be (e.g. auto_hybrid=true); repeatable.")
@click.option("--paging", metavar="W|auto", help="Segmented bundle for layer-paged runs: W segments resident; "
              "decoders also take auto, the plan's choice (docs/paging.md).")
@click.option("--segments", type=int, metavar="N", help="With --paging: split into N segments at layer boundaries.")
@click.option("--cut", "cuts", multiple=True, metavar="TENSOR",
              help="With --paging: cut at this tensor (repeatable).")
@click.option("--buckets", metavar="auto|none|BxS,...",
              help="Boards that need static shapes: (batch x sequence) shapes to build; default auto, chosen from "
                   "the plan (docs/deploy.md#buckets).")
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), help="Bundle directory to write (required "
              "unless --dry-run).")
@click.option("--dry-run", is_flag=True, help="Decide and plan exactly as deploy would, print the plan and stop: "
              "nothing converted or written (exit 0 fits, 1 does not fit).")
@trust_remote_code_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def deploy(
    model: Path, board: str, quant: str | None, calib: Path | None, golden_inputs: Path | None,
    shapes: tuple[str, ...], threshold: float | None, max_samples: int, force: bool, no_cache: bool,
    backend_options: tuple[str, ...], paging: str | None, segments: int | None, cuts: tuple[str, ...],
    out: Path | None,
    as_json: bool, ctx: int | None, buckets: str | None, runtime: str | None, trust_remote_code: bool,
    dry_run: bool = False, task_thresholds: tuple[str, ...] = (), board_only: bool = False,
) -> None:
    """Convert MODEL for BOARD, check it against onnxruntime fp32, and write a bundle.

    A causal language model (a Hugging Face directory whose config names *ForCausalLM) is converted
    with the backend's decoder path and checked against transformers fp32, greedy (docs/generation.md).
    """
    from edgeinfer.deploy import encoder as deploy_mod
    from edgeinfer.model.kind import Kind, kind
    from edgeinfer.progress import Progress
    from edgeinfer.run.loading import parse_shapes

    progress = Progress.for_command(as_json)
    if out is None and not dry_run:
        raise click.UsageError("Missing option '-o' / '--out' (or pass --dry-run)")
    planned = {"dry_run": dry_run, "on_plan": None if as_json else _announce, "board_only": board_only}
    if kind(model, hint="pass a Hugging Face directory, an .onnx file or a .pt2 program") is Kind.DECODER_DIR:
        if task_thresholds:
            raise InputError("--task-threshold applies to rerankers and classifiers, not to language models")
        _deploy_decoder(model, board, out, quant, ctx, calib, golden_inputs, force, threshold, no_cache, progress,
                        parse_options(backend_options), runtime, as_json,
                        {"--shape": shapes, "--cut": cuts, "--buckets": buckets}, trust_remote_code, planned, paging,
                        segments)
        return
    if ctx is not None:
        raise InputError(f"--ctx applies to decoder (language) models; {model} is not one (use --shape for inputs)")
    if runtime is not None:
        raise InputError(f"--runtime applies to decoder (language) models; {model} is not one")
    if paging == "auto":
        raise InputError(f"--paging auto applies to decoder (language) models; {model} is not one: pass --paging W")
    result = deploy_mod.deploy(
        model, board, out, quant=quant, calib=calib, golden_inputs=golden_inputs,
        shapes=parse_shapes(shapes), force=force, threshold=threshold, max_samples=max_samples,
        options=parse_options(backend_options), progress=progress, use_cache=not no_cache,
        paging=None if paging is None else _window(paging),
        segments=segments, cuts=list(cuts) or None, buckets=buckets, trust_remote_code=trust_remote_code, **planned,
        task_thresholds=_task_thresholds(task_thresholds),
    )
    if dry_run:
        return _dry_run(result, as_json)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)

    def render(r: dict[str, Any]) -> None:
        from edgeinfer.deploy.golden import summary_line

        out_c = console()
        how = " (cached conversion reused)" if r["cached"] else ""
        out_c.print(f"bundle {r['bundle']}: {r['backend']} {r['scheme']} for {r['board']}{how}")
        out_c.print("  " + summary_line(r["golden"]) + f" (ran on {r['golden'].get('device', '?')})")
        if r["golden"].get("task"):
            from edgeinfer.deploy.ranking import summary_line as task_line

            out_c.print("  " + task_line(r["golden"]["task"]))
        if r.get("buckets"):
            shapes = " ".join(f"{i['batch']}x{i['seq']}" for i in r["buckets"]["items"])
            out_c.print(f"  buckets (batch x seq): {shapes}, each golden-checked")
            out_c.print(f"  chosen: {r['buckets']['chosen_by']}")
        _left_out(out_c, r, board_only)

    emit(result.to_json(), as_json, render)


def _deploy_decoder(model: Path, board: str, out: Path | None, quant: str | None, ctx: int | None, calib: Path | None,
                    golden_inputs: Path | None, force: bool, threshold: float | None, no_cache: bool, progress: Any,
                    options: dict[str, Any], runtime: str | None, as_json: bool,
                    encoder_only: dict[str, Any], trust_remote_code: bool, planned: dict[str, Any],
                    paging: str | None, segments: int | None) -> None:
    from edgeinfer.deploy.decoder import deploy_decoder

    given = [k for k, v in encoder_only.items() if v]
    if given:
        raise InputError(f"{given[0]} does not apply to decoder (language) models; use --ctx for the context")
    if threshold is not None and not (math.isfinite(threshold) and -1 <= threshold <= 1):
        raise InputError(f"--threshold is a minimum logits cosine between -1 and 1, got {threshold}")
    result = deploy_decoder(model, board, out, quant=quant, ctx=ctx, calib=calib, golden_inputs=golden_inputs,
                            force=force, threshold=threshold, options=options, runtime=runtime, progress=progress,
                            use_cache=not no_cache, trust_remote_code=trust_remote_code, paging=paging,
                            segments=segments, **planned)
    if planned["dry_run"]:
        return _dry_run(result, as_json)
    for n in result.notes:
        click.echo(f"note: {n}", err=True)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)

    def render(r: dict[str, Any]) -> None:
        from edgeinfer.run.generation.golden import summary_line

        how = " (cached conversion reused)" if r["cached"] else ""
        out_c = console()
        out_c.print(f"bundle {r['bundle']}: decoder, {r['backend']} {r['scheme']} for {r['board']} (runtime "
                    f"{r['runtime']}), ctx {r['context']}{how}")
        where = f" (ran on {r['golden'].get('device', '?')})" if r["golden"].get("ran") else ""
        out_c.print("  " + summary_line(r["golden"]) + where + _note(r["golden"], "\n  "))
        if r["paging"]:
            pg = r["paging"]
            out_c.print(f"  layer-paged: {pg['segments']} segments, window {pg['window']} (golden-checked paged; "
                        "`generate --window W` loads another)")
        if r["speed_check"]:
            from edgeinfer.planning.selfcheck import speed_line

            out_c.print("  " + speed_line(r["speed_check"]))
        _left_out(out_c, r, planned["board_only"])

    emit(result.to_json(), as_json, render)


def _left_out(out_c: Any, r: dict[str, Any], board_only: bool) -> None:
    if r["left_out"]:
        more = len(r["left_out"]) - 3
        names = ", ".join(r["left_out"][:3]) + (f" and {more} more" if more > 0 else "")
        out_c.print(f"  left out for the board (only the simulator here reads them): {names}; check it on this "
                    "machine from a bundle deployed without --board-only")
    elif board_only:
        out_c.print(f"  --board-only: nothing to leave out, every file of a {r['backend']} bundle is what the board "
                    "runs")


def _announce(plan: Any) -> None:
    """The plan a deploy builds for, on stderr before converting."""
    from edgeinfer.planning.decision import summary_lines

    for line in summary_lines(plan):
        click.echo(line, err=True)


def _dry_run(result: Any, as_json: bool) -> None:
    """``deploy --dry-run``: the plan as ``edgeinfer plan`` prints it; exit 1 when it does not fit."""
    from edgeinfer.cli.plan import render_plan

    emit(result.to_json(), as_json, lambda _: render_plan(result.plan))
    if not result.fits:
        click.get_current_context().exit(errors.NEGATIVE)


@click.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--inputs", type=click.Path(path_type=Path), help="New samples (.txt/.npz/dir); needs --reference.")
@click.option("--reference", type=click.Path(path_type=Path), help="fp32 ONNX to compare against for --inputs.")
@click.option("--threshold", type=float, help="Minimum cosine (default: the bundle's).")
@click.option("--device", "-d", help="Device of the backend.")
@trust_remote_code_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def golden(
    ctx: click.Context, bundle_dir: Path, inputs: Path | None, reference: Path | None, threshold: float | None,
    device: str | None, as_json: bool, trust_remote_code: bool,
) -> None:
    """Re-run the golden check of BUNDLE on this machine (exit 1 when it fails)."""
    from edgeinfer.model.kind import Kind, kind

    if threshold is not None and not (math.isfinite(threshold) and -1 <= threshold <= 1):
        raise InputError(f"--threshold is a minimum cosine between -1 and 1, got {threshold}")
    if kind(bundle_dir, "bundle") is Kind.DECODER_BUNDLE:
        from edgeinfer.deploy.decoder import golden_bundle
        from edgeinfer.run.generation.golden import summary_line

        if inputs or reference:
            raise InputError("--inputs/--reference apply to encoder bundles; a decoder bundle is checked against "
                             "the fp32 reference recorded when it was deployed")
        report = golden_bundle(bundle_dir, device=device, min_cosine=threshold, trust_remote_code=trust_remote_code)
        emit(report, as_json, lambda r: console().print(summary_line(r) + f" (ran on {r['device']})" + _note(r)))
        if not report["passed"]:
            click.echo("error: decoder golden check failed (see the report above)", err=True)
            ctx.exit(errors.NEGATIVE)
        return
    from edgeinfer.deploy import golden as golden_mod

    report = golden_mod.check_bundle(bundle_dir, inputs=inputs, reference=reference, threshold=threshold,
                                     device=device)
    emit(report, as_json, lambda r: console().print(golden_mod.summary_line(r) + f" (ran on {r['device']})"))
    if not report["passed"]:
        task = report.get("task")
        why = "; ".join(task["failures"][:3]) if task else f"worst: {golden_mod.worst_samples_line(report)}"
        click.echo(f"error: golden check failed; {why}", err=True)
        ctx.exit(errors.NEGATIVE)


@click.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--reseal", is_flag=True,
              help="Record the files the manifest does not record (when they belong to the bundle and nothing "
                   "recorded is damaged).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def verify(ctx: click.Context, bundle_dir: Path, reseal: bool, as_json: bool) -> None:
    """Check every file of BUNDLE against the sizes and sha256 in its manifest: exit 2 when one differs or a
    symlink leads out of the bundle, 1 when the bundle holds files the manifest does not record, 3 when this
    installation lacks a package the bundle runs with (its manifest's `requires`) or its backend would refuse an
    artifact (another toolkit release than it reads, another target)."""
    from edgeinfer.model.bundle import verify as verify_bundle

    report = verify_bundle(bundle_dir, reseal=reseal)

    def render(r: dict[str, Any]) -> None:
        if r["ok"]:
            console().print(f"bundle {r['bundle']}: {r['files']} files, {r['bytes']} bytes, all match the manifest")
        for p in r["problems"]:
            click.echo(f"  {p}")
        for link in r["outside_links"]:
            click.echo(f"  {link} leads out of the bundle")
        for rel in r["unrecorded"]:
            click.echo(f"  {rel} is not recorded in the manifest")
        for rel in r["resealed"]:
            click.echo(f"  {rel} recorded (--reseal)")
        if r["left_out"]:
            click.echo(f"  deployed --board-only: {len(r['left_out'])} files only the converting machine's simulator "
                       "reads were left out; it runs on the board")
        for req in r["requires"]:
            if req["installed"]:
                click.echo(f"  runs with {req['requirement']}: installed")
            else:
                click.echo(f"  runs with {req['requirement']}: not installed ({', '.join(req['missing'])} missing); "
                           f"{req['install']}")
        for ref in r["refused"]:
            click.echo(f"  refused here: {ref['reason']}")

    emit(report, as_json, render)
    if report["outside_links"]:
        click.echo(f"error: bundle {bundle_dir} holds a symlink that leads out of it ({report['outside_links'][0]}); "
                   "remove it, or deploy the model again", err=True)
        ctx.exit(errors.USAGE)
    if report["problems"]:
        n = len(report["problems"])
        click.echo(f"error: bundle {bundle_dir} is damaged: {n} file{'s differ' if n > 1 else ' differs'} from the "
                   "manifest; deploy the model again", err=True)
        ctx.exit(errors.USAGE)
    if report["unrecorded"]:
        n = len(report["unrecorded"])
        click.echo(f"error: bundle {bundle_dir} holds {n} file{'s' if n > 1 else ''} its manifest does not record; "
                   f"remove {'them' if n > 1 else 'it'}, or, if {'they belong' if n > 1 else 'it belongs'} to the "
                   f"bundle, record {'them' if n > 1 else 'it'} with `edgeinfer verify {bundle_dir} --reseal` "
                   "(symlinks are never recorded: replace them with the files)", err=True)
        ctx.exit(errors.NEGATIVE)
    if not report["installed"]:
        lacking = [r for r in report["requires"] if not r["installed"]]
        why = (f"{lacking[0]['requirement']} is not installed; {lacking[0]['install']}" if lacking
               else report["refused"][0]["reason"])
        click.echo(f"error: this installation cannot run bundle {bundle_dir}: {why}", err=True)
        ctx.exit(errors.UNAVAILABLE)


def _task_thresholds(items: tuple[str, ...]) -> dict[str, float] | None:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"--task-threshold takes METRIC=NUMBER (e.g. ndcg=0.95), got {item!r}") from None
        if not eq:
            raise InputError(f"--task-threshold takes METRIC=NUMBER (e.g. ndcg=0.95), got {item!r}")
    return out or None


def _window(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--paging must be a positive window (segments resident), got {value!r}") from None


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


def _note(report: dict[str, Any], sep: str = "\n") -> str:
    """A decoder's caveat (how its golden check ran here), as a line of its own."""
    return f"{sep}note: {report['caveat']}" if report.get("caveat") else ""
