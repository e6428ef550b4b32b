"""``edgeinfer bench``: throughput and latency of an encoder bundle over batch sizes, or of a decoder
(a Hugging Face causal-LM directory or a decoder bundle) over prompt lengths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgeinfer.cli.generate import THREADS_HELP, WINDOW_HELP
from edgeinfer.cli.output import console, emit, json_safe
from edgeinfer.cli.trust import trust_remote_code_option
from edgeinfer.errors import InputError

if TYPE_CHECKING:
    from edgeinfer.model.kind import Kind

MAX_BENCH_BATCH = 4096  # far past any edge NPU's useful batch; larger values only exhaust memory
MAX_BENCH_SEQ = 2**20
MAX_BENCH_REPEAT = 100_000
ENCODER_REPEAT, DEFAULT_BATCH = 20, "1,8,32"


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


@click.command()
@click.argument("bundle_dir", metavar="MODEL_OR_BUNDLE", type=click.Path(path_type=Path))
@click.option("--batch", default=None, help=f"Encoders: batch sizes, comma-separated [default: {DEFAULT_BATCH}].")
@click.option("--seq", default=None, help="Encoders: sequence lengths for dynamic-shape bundles, comma-separated.")
@click.option("--prompt-lengths", default=None,
              help="Decoders: prompt lengths in tokens, comma-separated [default: 16,128,512, capped by the "
                   "context].")
@click.option("--new-tokens", type=int, default=None, help="Decoders: tokens generated per run [default: 64].")
@click.option("--ctx", type=int, help="Decoders: context (KV cache positions) to load a model directory with.")
@click.option("--backend", "-b", help="Decoders: backend to run a model directory on (default: transformers).")
@click.option("--threads", type=int, help=THREADS_HELP)
@click.option("--window", type=int, help=WINDOW_HELP)
@click.option("--repeat", type=int, default=None,
              help=f"Timed runs per case [default: {ENCODER_REPEAT} for encoders, 3 for decoders].")
@click.option("--device", "-d", help="Device of the backend.")
@click.option("--board", "board", default=None, help="Decoder bundles: board (name or YAML) the self-check plans "
              "for [default: the bundle's].")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a PNG chart of throughput and latency.")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Also write the JSON report to this file.")
@trust_remote_code_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def bench(bundle_dir: Path, batch: str | None, seq: str | None, prompt_lengths: str | None, new_tokens: int | None,
          ctx: int | None, backend: str | None, threads: int | None, repeat: int | None, device: str | None,
          plot: Path | None, output: Path | None, as_json: bool, board: str | None = None,
          trust_remote_code: bool = False, window: int | None = None) -> None:
    """Latency, throughput and peak memory of MODEL_OR_BUNDLE.

    \b
    Encoder bundle: latency p50/p95/p99 and samples/s per batch size.
    Decoder (Hugging Face causal-LM directory, decoder bundle or decoder file: .gguf, .rkllm):
    TTFT, prefill and decode tokens/s, TPOT p50/p99, peak RSS and KV cache bytes per prompt
    length, greedy. A decoder bundle (a file with --board) is also compared with what
    `edgeinfer plan` predicts (self_check in the JSON; its rows are input for `edgeinfer
    calibrate`).
    """
    from edgeinfer.files import check_output_file
    from edgeinfer.run import benchmark

    if repeat is not None and not 1 <= repeat <= MAX_BENCH_REPEAT:
        raise InputError(f"--repeat must be between 1 and {MAX_BENCH_REPEAT}, got {repeat}")
    batches = _int_list(batch, "--batch", MAX_BENCH_BATCH) if batch is not None else None
    seqs = _int_list(seq, "--seq", MAX_BENCH_SEQ) if seq else None
    lengths = _int_list(prompt_lengths, "--prompt-lengths", MAX_BENCH_SEQ) if prompt_lengths is not None else None
    if new_tokens is not None and new_tokens < 1:
        raise InputError(f"--new-tokens must be at least 1, got {new_tokens}")
    if ctx is not None and ctx < 1:
        raise InputError(f"--ctx must be a positive number of tokens, got {ctx}")
    if plot is not None:  # before the benchmark, not after minutes of it
        check_output_file(plot, "--plot", benchmark.PLOT_SUFFIXES)
    if output is not None:
        check_output_file(output, "--output", (".json",))
    from edgeinfer.model.kind import Kind, kind

    found = kind(bundle_dir, "bundle")
    loaded = _load(bundle_dir, found, backend, device, ctx, threads, trust_remote_code, window)
    from edgeinfer.run.generation.generator import Generator

    if isinstance(loaded, Generator):
        if batches or seqs:
            loaded.close()
            raise InputError("--batch and --seq apply to encoder bundles; for a decoder use --prompt-lengths")
        paging_before = loaded.decoder.paging_stats()
        report = _bench_decoder(loaded, bundle_dir, lengths, new_tokens, repeat, as_json)
        if paging_before is not None and found is Kind.DECODER_BUNDLE:
            from edgeinfer.model.bundle import Bundle
            from edgeinfer.run.paged_decoder import bench_report

            report["paging"] = bench_report(Bundle.open(bundle_dir), loaded.decoder, paging_before, report)
        check = _self_check(bundle_dir, found, report, board)
        if check is not None:
            report["self_check"] = check
        if plot:
            from edgeinfer.run.generation import bench as decoder_bench

            report["plot"] = str(decoder_bench.plot(report, plot))
        render = _render_decoder
    else:
        if lengths or new_tokens is not None or ctx is not None or board is not None:
            loaded.close()
            raise InputError("--prompt-lengths, --new-tokens, --ctx and --board apply to decoders; for an encoder "
                             "bundle use --batch and --seq")
        report = _bench_encoder(loaded, bundle_dir, batches, seqs, repeat, as_json)
        if plot:
            report["plot"] = str(benchmark.plot(report, plot))
        render = _render_encoder
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    emit(report, as_json, render)


def _load(path: Path, found: Kind, backend: str | None, device: str | None, ctx: int | None, threads: int | None,
          trust_remote_code: bool, window: int | None = None) -> Any:
    """A Generator for a decoder directory or decoder bundle, else an encoder bundle's Session."""
    from edgeinfer.model.bundle import not_a_bundle
    from edgeinfer.model.kind import Kind
    from edgeinfer.run.loading import decoder_threads, load
    from edgeinfer.run.paged_decoder import window_option

    paged = window_option(path, found, window)
    match found:
        case Kind.DECODER_DIR | Kind.DECODER_FILE:
            return load(path, backend=backend, device=device, ctx=ctx, trust_remote_code=trust_remote_code,
                        **decoder_threads(path, found, backend, threads))
        case Kind.ENCODER_BUNDLE | Kind.DECODER_BUNDLE:
            if ctx is not None:
                raise InputError("--ctx applies to a model directory; a bundle runs with the context it was "
                                 "built for")
            if threads is not None and found is Kind.ENCODER_BUNDLE:
                raise InputError("--threads applies to decoders; an encoder bundle runs with its backend's "
                                 "threads")
            return load(path, backend=backend, device=device, trust_remote_code=trust_remote_code, **paged,
                        **decoder_threads(path, found, backend, threads))
    raise not_a_bundle(path)


def _bench_decoder(gen: Any, model: Path, lengths: list[int] | None, new_tokens: int | None, repeat: int | None,
                   as_json: bool) -> dict[str, Any]:
    from edgeinfer.progress import Progress
    from edgeinfer.run.generation import bench as decoder_bench

    with gen:
        return decoder_bench.bench(gen, str(model), lengths, new_tokens or decoder_bench.DEFAULT_NEW_TOKENS,
                                   repeat or decoder_bench.DEFAULT_REPEAT,
                                   progress=Progress.for_command(as_json))


def _self_check(path: Path, found: Kind, report: dict[str, Any], board: str | None) -> dict[str, Any] | None:
    """The plan's predictions for a decoder bundle next to the measurements; None for a model directory."""
    from edgeinfer.errors import BoardError
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.model.decoder_bundle import TOKENIZER
    from edgeinfer.model.kind import Kind
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.models.hf import read_config, spec_from_config
    from edgeinfer.planning.selfcheck import self_check

    if found is Kind.DECODER_FILE:
        return _file_self_check(path, report, board)
    if found is not Kind.DECODER_BUNDLE:
        if board is not None:
            raise InputError("--board applies to decoder bundles and files (the self-check); this is a model "
                             "directory")
        return None
    m = Bundle.open(path).manifest
    cfg_path = path / (m.decoder or {}).get("tokenizer", TOKENIZER) / "config.json"
    if not cfg_path.is_file():
        return {"skipped": "the bundle keeps no config.json: nothing to plan from"}
    try:
        b = get_board(board or m.board)
    except BoardError as e:
        if board is not None:
            raise
        return {"skipped": f"{e.one_line()}; pass --board PROFILE.yaml"}
    cfg = read_config(cfg_path)
    spec = spec_from_config(cfg, m.source.get("name") or path.name, str(cfg_path))
    paged = m.decoder.get("paging")
    window = (report.get("paging") or {}).get("window") or (paged or {}).get("window")
    return self_check(report, spec, cfg, b, m.scheme, m.decoder["context"], f"edgeinfer bench {path.name}",
                      runtime=m.decoder.get("runtime"), paging=(window, paged["segments"]) if paged else None)


def _file_self_check(path: Path, report: dict[str, Any], board: str | None) -> dict[str, Any]:
    """The self-check of a decoder file (``.gguf``, ``.rkllm``): planned on ``board`` (the file records none) in
    the runtime that runs it, with the architecture of the config.json next to it, else of the file itself (a
    ``.gguf``'s metadata; its calibration rows then name the file)."""
    from edgeinfer.errors import ModelError
    from edgeinfer.planning.boards import get_board
    from edgeinfer.planning.decision import decide
    from edgeinfer.planning.models import resolve
    from edgeinfer.planning.models.hf import read_config
    from edgeinfer.planning.selfcheck import self_check

    if board is None:
        return {"skipped": f"{path.name} records no board: pass --board to compare with the plan"}
    try:
        spec = resolve(path.resolve())
    except ModelError as e:
        return {"skipped": e.one_line()}
    b = get_board(board)
    d = decide(spec, b, ctx=report["context"])
    cfg = path.parent / "config.json"
    return self_check(report, spec, read_config(cfg) if cfg.is_file() else None, b, d.scheme.name,
                      report["context"], f"edgeinfer bench {path.name}", runtime=d.runtime)


def _bench_encoder(session: Any, bundle_dir: Path, batches: list[int] | None, seqs: list[int] | None,
                   repeat: int | None, as_json: bool) -> dict[str, Any]:
    from edgeinfer.model.bundle import Bundle
    from edgeinfer.progress import Progress
    from edgeinfer.run import benchmark

    b = Bundle.open(bundle_dir)
    with session:
        return benchmark.bench(b, session, batches or _int_list(DEFAULT_BATCH, "--batch", MAX_BENCH_BATCH),
                               list(seqs) if seqs else [None], repeat or ENCODER_REPEAT,
                               progress=Progress.for_command(as_json))


def _render_encoder(r: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(title=f"{r['bundle']} · {r['backend']} {r['scheme']} · ran on {r['device']}")
    for col in ("batch", "seq", "p50 ms", "p95 ms", "p99 ms", f"{r.get('unit', 'samples')}/s", "peak RSS MiB"):
        t.add_column(col, justify="right")
    for row in r["results"]:
        lat = row["latency_ms"]
        rss = f"{row['peak_rss_bytes'] / 2**20:.0f}" if row["peak_rss_bytes"] else "-"
        t.add_row(str(row["batch"]), str(row["seq"]), f"{lat['p50']:.1f}", f"{lat['p95']:.1f}",
                  f"{lat['p99']:.1f}", f"{row['throughput_per_s']:.1f}", rss)
    console().print(t)
    for note in r["notes"]:
        console().print(f"note: {note}")
    if r.get("plot"):
        console().print(f"chart: {r['plot']}")


def _render_decoder(r: dict[str, Any]) -> None:
    from rich.table import Table

    threads = f", {r['threads']} thread{'s' if r['threads'] > 1 else ''}" if r.get("threads") else ""
    t = Table(title=f"{r['model']} · {r['backend']} on {r['device']}{threads} · ctx {r['context']} · "
                    f"{r['new_tokens']} new tokens, greedy, median of {r['repeat']}")
    for col in ("prompt", "TTFT ms", "prefill tok/s", "decode tok/s", "TPOT p50 ms", "TPOT p99 ms",
                "peak RSS MiB", "KV MiB"):
        t.add_column(col, justify="right")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for row in r["results"]:
        rss = f"{row['peak_rss_bytes'] / 2**20:.0f}" if row["peak_rss_bytes"] else "-"
        t.add_row(str(row["prompt_tokens"]), ms(row["ttft_ms"]), f"{row['prefill_tokens_per_s']:.0f}",
                  f"{row['decode_tokens_per_s']:.1f}", ms(row["tpot_ms_p50"]), ms(row["tpot_ms_p99"]), rss,
                  f"{row['kv_cache_bytes'] / 2**20:.2f}")
    console().print(t)
    for note in r["notes"]:
        console().print(f"note: {note}")
    _render_paging(r.get("paging"))
    _render_self_check(r.get("self_check"))
    if r.get("plot"):
        console().print(f"chart: {r['plot']}")


def _render_paging(pg: dict[str, Any] | None) -> None:
    if not pg:
        return
    con = console()
    per = ", ".join("-" if ms is None else f"{ms:.1f}" for ms in pg["page_in_ms_mean"])
    con.print(f"paging: window {pg['window']} of {pg['segments']} segments; {pg['page_ins_per_token']:.2f} page-ins "
              f"per generated token; page-in ms per segment (mean): {per}")
    err = "" if pg["resident_error_pct"] is None else f" ({pg['resident_error_pct']:+.1f}%)"
    want = "-" if pg["predicted_resident_bytes"] is None else f"{pg['predicted_resident_bytes']} B"
    con.print(f"  resident weights: measured {pg['measured_resident_bytes']} B vs plan {want}{err}")
    for n in pg["notes"]:
        con.print(f"  note: {n}")


def _render_self_check(sc: dict[str, Any] | None) -> None:
    if not sc:
        return
    con = console()
    if sc.get("skipped"):
        con.print(f"self-check: skipped ({sc['skipped']})")
        return

    def cell(meas: float | None, pred: float | None, err: float | None, fmt: str) -> str:
        if meas is None:
            return "-"
        return f"{meas:{fmt}} vs {pred:{fmt}} ({err:+.0f}%)" if pred is not None else f"{meas:{fmt}} vs -"

    def times(r: float | None) -> str:
        return "" if r is None else f" (measured {r:.3g}× the prediction)"

    con.print(f"self-check against `edgeinfer plan` on {sc['board']} ({sc['runtime']}, {sc['scheme']}, ctx "
              f"{sc['context']}; {sc['speed_basis']}): measured vs predicted (error of the prediction)")
    con.print(f"  ran on: {sc['device']} — " + ("a board figure" if sc["board_figure"] else
                                                 f"a {sc['ran_on']} figure, not one of {sc['board']}"))
    for c in sc["comparisons"]:
        dec = cell(c["decode_tokens_per_s"], c["predicted_decode_tokens_per_s"], c["decode_error_pct"], ".1f")
        con.print(f"  prompt {c['prompt_tokens']}: decode {dec}"
                  f" tok/s{times(c['decode_ratio'])}, "
                  f"TTFT {cell(c['ttft_ms'], c['predicted_ttft_ms'], c['ttft_error_pct'], '.0f')} ms, "
                  f"peak {cell(c['peak_mib'], c['predicted_peak_mib'], c['peak_error_pct'], '.0f')} MiB")
    for n in sc["notes"]:
        con.print(f"  note: {n}")
    if sc["rows"]:
        con.print("  (the JSON's self_check.rows are input for `edgeinfer calibrate`)")
