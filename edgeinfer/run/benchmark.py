"""``edgeinfer bench``: latency percentiles, throughput and peak memory of a bundle per batch size."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from edgeinfer.contract import measure
from edgeinfer.contract.backend import Session, latency_stats
from edgeinfer.errors import InputError
from edgeinfer.model.buckets import longest_seq
from edgeinfer.model.bundle import Bundle
from edgeinfer.progress import Progress
from edgeinfer.run.padding import run_padded, static_batch


def feeds_for(bundle: Bundle, base: dict[str, np.ndarray], batch: int, seq: int | None) -> dict[str, np.ndarray]:
    """``base`` (one golden sample) tiled to ``batch`` rows, cut or padded to ``seq`` for dynamic models."""
    out = {}
    longest = longest_seq(bundle.manifest.buckets, bundle.manifest.inputs)
    if seq is not None and longest and seq > longest:
        raise InputError(f"--seq {seq} is longer than the bundle's longest bucket ({longest})")
    for spec in bundle.manifest.inputs:
        arr = base[spec.name]
        if seq is not None and arr.ndim >= 2:
            if isinstance(spec.shape[1], int) and spec.shape[1] != seq and not longest:
                raise InputError(f"bundle input {spec.name!r} has a static sequence of {spec.shape[1]}, not {seq}")
            arr = arr[:, :seq] if arr.shape[1] >= seq else np.pad(arr, [(0, 0), (0, seq - arr.shape[1])])
        reps = -(-batch // arr.shape[0])
        out[spec.name] = np.ascontiguousarray(np.concatenate([arr] * reps)[:batch])
    return out


def bench(
    bundle: Bundle,
    session: Session,
    batches: list[int],
    seqs: list[int | None],
    repeat: int = 20,
    warmup: int = 2,
    progress: Progress | None = None,
) -> dict[str, Any]:
    from edgeinfer.model.samples import load_saved_samples

    progress = progress or Progress(enabled=False)
    golden = bundle.path / "golden" / "inputs.npz"
    if not golden.exists():
        raise InputError(f"bundle {bundle.path} has no golden inputs to benchmark with; deploy it again")
    base = load_saved_samples(golden)[0]
    fixed = static_batch(session.inputs)
    call = _scoring_call(bundle, session)
    rows = []
    cases = [(b, s) for s in seqs for b in batches]
    for b, s in progress.track(cases, "benchmarking", total=len(cases)):
        feeds = feeds_for(bundle, base, b, s)
        for _ in range(warmup):
            call(feeds)
        reset = measure.reset_peak_rss()  # each batch size gets its own peak
        times, cpu = [], measure.cpu_sample()
        for _ in range(repeat):
            t = time.perf_counter()
            call(feeds)
            times.append((time.perf_counter() - t) * 1e3)
        lat = latency_stats(times)
        p95 = sorted(times)[max(0, int(np.ceil(0.95 * len(times))) - 1)]
        rows.append(
            {
                "batch": b,
                "seq": s if s is not None else _seq(feeds),
                "latency_ms": {"p50": lat["p50"], "p95": p95, "p99": lat["p99"], "mean": lat["mean"]},
                "throughput_per_s": b / (lat["mean"] / 1e3),
                "peak_rss_bytes": measure.peak_rss_bytes() if reset else None,
                "runs_per_call": -(-b // fixed) if fixed else 1,
                "others_busy_cpus": measure.others_busy_cpus(cpu, measure.cpu_sample()),
            }
        )
    task = bundle.manifest.task
    load = measure.busy_note(measure.most_busy(r["others_busy_cpus"] for r in rows))
    return {
        **({"task": task.kind, "unit": "pairs" if task.kind == "rerank" else "texts"} if task else {}),
        "bundle": str(bundle.path),
        "backend": bundle.manifest.backend,
        "board": bundle.manifest.board,
        "scheme": bundle.manifest.scheme,
        "device": session.device,
        "static_batch": fixed,
        "repeat": repeat,
        "results": rows,
        "notes": [load] if load else [],
    }


def _scoring_call(bundle: Bundle, session: Session) -> Any:
    """What one timed call runs: the session, and for a reranker or classifier also its logits turned into
    scores (a row of the golden inputs is one (query, document) pair or one text)."""
    task = bundle.manifest.task
    if task is None:
        return lambda feeds: run_padded(session, feeds)
    from edgeinfer.run import scoring

    return lambda feeds: scoring.activate(scoring.logits(bundle, run_padded(session, feeds)), task.activation)


def _seq(feeds: dict[str, np.ndarray]) -> int | None:
    arr = next(iter(feeds.values()))
    return int(arr.shape[1]) if arr.ndim >= 2 else None


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plot(report: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for seq in sorted({r["seq"] for r in rows}, key=lambda x: (x is None, x)):
        sel = [r for r in rows if r["seq"] == seq]
        xs = [r["batch"] for r in sel]
        ax1.plot(xs, [r["throughput_per_s"] for r in sel], marker="o", label=f"seq {seq}")
        ax2.plot(xs, [r["latency_ms"]["p50"] for r in sel], marker="o", label=f"p50, seq {seq}")
        ax2.plot(xs, [r["latency_ms"]["p99"] for r in sel], marker="x", linestyle="--", label=f"p99, seq {seq}")
    ax1.set(xlabel="batch size", ylabel="samples / s", title="throughput")
    ax2.set(xlabel="batch size", ylabel="ms per call", title="latency")
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    static = f" · static batch {report['static_batch']}: batch N runs as N/{report['static_batch']} calls" if (
        report.get("static_batch")) else ""
    fig.suptitle(f"{report['board']} · {report['backend']} {report['scheme']} · ran on {report['device']}{static}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
