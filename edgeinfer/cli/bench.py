"""``edgeinfer bench``: throughput and latency of a bundle over batch sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from edgeinfer.cli.output import console, emit
from edgeinfer.errors import InputError

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


@click.command()
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
    from edgeinfer.progress import Progress
    from edgeinfer.run import benchmark
    from edgeinfer.run.bundle import Bundle

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


