"""``edgeinfer profile``: latency and the top-N operators by time of a model, encoder or decoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.generate import WINDOW_HELP
from edgeinfer.cli.output import console, emit
from edgeinfer.cli.trust import trust_remote_code_option
from edgeinfer.errors import InputError

MAX_TOP = 10_000
MAX_REPEAT = 100_000


@click.command("profile")
@click.argument("model", metavar="MODEL_OR_BUNDLE", type=click.Path(path_type=Path))
@click.option("--top", type=int, default=10, show_default=True, help="Operators to list (per phase for decoders).")
@click.option("--repeat", type=int, default=10, show_default=True, help="Timed runs (decoders: per phase).")
@click.option("--backend", "-b", help="Backend to run on (default: the model's native one / transformers).")
@click.option("--device", "-d", help="Device of the backend.")
@click.option("--ctx", type=int, help="Decoders: context (KV cache positions) to load a model directory with.")
@click.option("--prompt-length", type=int, help="Decoders: prompt tokens of the prefill phase [default: 128].")
@click.option("--threads", type=int, help="Decoders: CPU threads of the backend.")
@click.option("--window", type=int, help=WINDOW_HELP)
@trust_remote_code_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
def profile_cmd(model: Path, top: int, repeat: int, backend: str | None, device: str | None, ctx: int | None,
                prompt_length: int | None, threads: int | None, as_json: bool, trust_remote_code: bool,
                window: int | None = None) -> None:
    """Latency and the slowest operators of MODEL_OR_BUNDLE, from its backend's own profiler.

    \b
    Encoders (model file or bundle): one run on the bundle's golden input (or a synthetic one).
    Decoders (Hugging Face causal-LM directory or decoder bundle): per phase, prefill and decode.
    """
    from edgeinfer.model.kind import Kind, kind
    from edgeinfer.run import profile as prof
    from edgeinfer.run.loading import decoder_threads, load
    from edgeinfer.run.paged_decoder import window_option

    prof.check_counts(top, repeat)
    if top > MAX_TOP or repeat > MAX_REPEAT:
        raise InputError(f"--top is at most {MAX_TOP} and --repeat at most {MAX_REPEAT}")
    for name, value in (("--ctx", ctx), ("--prompt-length", prompt_length), ("--threads", threads)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be at least 1, got {value}")
    found = kind(model)
    if ctx is not None and found not in (Kind.DECODER_DIR, Kind.DECODER_FILE):
        raise InputError("--ctx applies to a decoder model directory or file; a bundle runs with the context it "
                         "was built for")
    if threads is not None and found not in (Kind.DECODER_DIR, Kind.DECODER_FILE, Kind.DECODER_BUNDLE):
        raise InputError("--threads applies to decoders; an encoder runs with its backend's threads")
    options: dict[str, Any] = {} if ctx is None else {"ctx": ctx}
    options.update(window_option(model, found, window), **decoder_threads(model, found, backend, threads))
    with load(model, backend=backend, device=device, trust_remote_code=trust_remote_code, **options) as m:
        report = prof.profile(m, model, top=top, repeat=repeat, prompt_length=prompt_length)
    emit(report, as_json, _render)


def _render(r: dict[str, Any]) -> None:
    out = console()
    out.print(f"[bold]{r['model']}[/] · {r['backend']} on {r['device']} · {r['runs']} timed runs")
    if r["kind"] == "encoder":
        out.print(f"input: {r['input']['source']} {r['input']['shapes']}")
        _section(out, "run", r)
        return
    out.print(f"context {r['context']}, prompt {r['prompt_tokens']} tokens")
    for phase, p in r["phases"].items():
        _section(out, f"{phase} ({p['what']})", p)


def _section(out: Any, title: str, p: dict[str, Any]) -> None:
    from rich.table import Table

    lat = p["latency_ms"]
    line = "no latency" if lat is None else (f"p50 {lat['p50']:.2f} ms, p90 {lat['p90']:.2f} ms, "
                                            f"mean {lat['mean']:.2f} ms, min {lat['min']:.2f} ms")
    out.print(f"\n[bold]{title}[/]: {line}")
    if not p["ops"]:
        out.print(f"no operator table: {p['ops_note']}")
        return
    t = Table(title=f"top {len(p['ops'])} of {p['ops_profiled']} operators "
                    f"({p['ops_total_ms']:.2f} ms profiled in one run)")
    t.add_column("#", justify="right")
    t.add_column("operator", overflow="fold")  # the full name: it is what a tuning guide points at
    t.add_column("type", overflow="fold")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for i, op in enumerate(p["ops"], 1):
        share = "-" if op["share"] is None else f"{op['share'] * 100:.1f}%"
        t.add_row(str(i), op["name"], op["op_type"], f"{op['time_ms']:.3f}", share)
    out.print(t)
