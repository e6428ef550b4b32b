"""``edgeinfer bench`` on a decoder: TTFT, prefill and decode speed, TPOT, peak RSS and KV bytes
per prompt length, greedy, with warm-up and repeats.

Prompts have exact token lengths: the packaged golden sentences, tokenized by the model's own
tokenizer (repeated until long enough) and cut to the length; the same ids on every run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeinfer.contract import measure
from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import InputError
from edgeinfer.progress import Progress
from edgeinfer.run.generation.generator import Generator
from edgeinfer.run.generation.text import TextCodec

DEFAULT_PROMPT_LENGTHS = (16, 128, 512)
DEFAULT_NEW_TOKENS = 64
DEFAULT_REPEAT = 3
MEDIAN_KEYS = ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "tpot_ms_p50", "tpot_ms_p99", "total_ms")


def prompt_of_length(codec: TextCodec, n: int) -> list[int]:
    """Exactly ``n`` token ids of real text (deterministic for a given tokenizer)."""
    if n < 1:
        raise InputError(f"a prompt length must be at least 1 token, got {n}")
    text = (Path(__file__).parents[2] / "data" / "golden_sentences.txt").read_text()
    ids = codec.encode(text)  # with the tokenizer's own special tokens (a BOS) at the start only
    again = codec.encode_raw(text)
    while len(ids) < n:
        ids += again
    return ids[:n]


def plan_lengths(context: int, new_tokens: int, asked: Sequence[int] | None) -> tuple[list[int], list[str]]:
    """Prompt lengths that fit ``context`` with ``new_tokens`` after them, and notes on what was capped.

    The defaults are capped to what fits; lengths the user asked for that do not fit are refused."""
    if new_tokens < 1:
        raise InputError(f"--new-tokens must be at least 1, got {new_tokens}")
    room = context - new_tokens
    if room < 1:
        raise InputError(f"the context of {context} tokens leaves no room for a prompt before {new_tokens} new "
                         f"tokens; lower --new-tokens or load with a larger --ctx")
    if asked is not None:
        if not asked or any(n < 1 for n in asked):
            raise InputError(f"prompt lengths must be positive integers, got {list(asked)}")
        over = [n for n in asked if n > room]
        if over:
            raise InputError(f"prompt length {over[0]} + {new_tokens} new tokens exceed the context of {context}; "
                             f"use prompt lengths up to {room}, fewer --new-tokens, or a larger --ctx")
        return list(dict.fromkeys(asked)), []
    out, notes = [], []
    for n in DEFAULT_PROMPT_LENGTHS:
        if n > room:
            notes.append(f"prompt length {n} capped to {room}: context {context} minus {new_tokens} new tokens")
            n = room
        if n not in out:
            out.append(n)
    return out, notes


def _one_length(gen: Generator, ids: list[int], new_tokens: int, repeat: int, warmup: int) -> dict[str, Any]:
    opts = GenerationOptions(max_new_tokens=new_tokens, ignore_eos=True)  # greedy; always new_tokens tokens
    for _ in range(warmup):
        gen.generate_ids(ids, opts)
    reset = measure.reset_peak_rss()
    runs = [gen.generate_ids(ids, opts).metrics for _ in range(repeat)]
    row: dict[str, Any] = {"prompt_tokens": runs[0].prompt_tokens, "new_tokens": runs[0].generated_tokens}
    for key in MEDIAN_KEYS:
        values = [getattr(m, key) for m in runs if getattr(m, key) is not None]
        row[key] = statistics.median(values) if values else None
    row["peak_rss_bytes"] = measure.peak_rss_bytes() if reset else max(m.peak_rss_bytes for m in runs)
    row["kv_cache_bytes"] = gen.kv_cache_bytes
    row["others_busy_cpus"] = measure.most_busy(m.others_busy_cpus for m in runs)  # other work meanwhile
    row["runs"] = [{k: getattr(m, k) for k in MEDIAN_KEYS} for m in runs]
    return row


def bench(gen: Generator, model: str, prompt_lengths: Sequence[int] | None = None,
          new_tokens: int = DEFAULT_NEW_TOKENS, repeat: int = DEFAULT_REPEAT, warmup: int = 1,
          progress: Progress | None = None) -> dict[str, Any]:
    """Benchmark ``gen`` per prompt length (default 16 / 128 / 512, capped by the context)."""
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    if warmup < 0:
        raise InputError(f"warm-up runs must be 0 or more, got {warmup}")
    lengths, notes = plan_lengths(gen.context, new_tokens, prompt_lengths)
    progress = progress or Progress(enabled=False)
    rows = []
    for n in progress.track(lengths, "benchmarking", total=len(lengths)):
        rows.append(_one_length(gen, prompt_of_length(gen.codec, n), new_tokens, repeat, warmup))
    d = gen.decoder
    load = measure.busy_note(measure.most_busy(r["others_busy_cpus"] for r in rows))
    return {
        "kind": "decoder",
        "model": model,
        "backend": d.backend_name,
        "device": d.device,
        "threads": d.threads,
        "context": gen.context,
        "kv_cache_bytes": gen.kv_cache_bytes,
        "new_tokens": new_tokens,
        "repeat": repeat,
        "warmup": warmup,
        "sampling": "greedy, EOS ignored (every run generates new_tokens tokens)",
        "statistic": "median over the repeats (tpot_ms_p50/p99: each run's percentile, median over runs)",
        "notes": notes + ([d.caveat] if d.caveat else []) + ([load] if load else []),
        "results": rows,
    }


def plot(report: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    xs = [r["prompt_tokens"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4))
    ax1.plot(xs, [r["ttft_ms"] for r in rows], marker="o")
    ax1.set(xlabel="prompt tokens", ylabel="ms", title="time to first token")
    ax2.plot(xs, [r["decode_tokens_per_s"] for r in rows], marker="o", label="decode")
    ax2.plot(xs, [r["prefill_tokens_per_s"] for r in rows], marker="s", label="prefill")
    ax2.set(xlabel="prompt tokens", ylabel="tokens / s", title="throughput")
    ax2.set_yscale("log")
    ax3.plot(xs, [r["tpot_ms_p50"] for r in rows], marker="o", label="p50")
    ax3.plot(xs, [r["tpot_ms_p99"] for r in rows], marker="x", linestyle="--", label="p99")
    ax3.set(xlabel="prompt tokens", ylabel="ms per token", title="time per output token")
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(True, alpha=0.3)
        if ax is not ax2:
            ax.set_ylim(bottom=0)
    ax2.legend()
    ax3.legend()
    fig.suptitle(f"{Path(report['model']).name} · {report['backend']} on {report['device']} · ctx "
                 f"{report['context']} · {report['new_tokens']} new tokens, greedy")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
