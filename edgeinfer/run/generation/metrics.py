"""Metrics of one generation: the same names for every backend and for ``bench``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edgeinfer.contract.measure import cpu_sample, latency_stats, others_busy_cpus


@dataclass
class GenerationMetrics:
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float  # request start → first new token sampled (prefill included)
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # tokens after the first, over the time after the first
    tpot_ms_p50: float | None  # time per output token after the first
    tpot_ms_p99: float | None
    total_ms: float
    peak_rss_bytes: int
    kv_cache_bytes: int
    others_busy_cpus: float | None = None  # CPUs other work kept busy meanwhile (measure.others_busy_cpus)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(prompt_tokens: int, token_times: list[float], start: float, prefill_end: float | None,
              peak_rss: int, kv_cache_bytes: int,
              cpu_at_start: tuple[float, float, float] | None = None) -> GenerationMetrics:
    """``token_times``: perf_counter() when each new token was chosen; ``start``: request start;
    ``cpu_at_start``: :func:`measure.cpu_sample` then."""
    n = len(token_times)
    first = token_times[0] if n else None
    end = token_times[-1] if n else start
    prefill_s = ((prefill_end or first or start) - start) or 1e-9
    gaps = [(b - a) * 1e3 for a, b in zip(token_times, token_times[1:])]
    stats = latency_stats(gaps) if gaps else None
    decode_s = (end - first) if first is not None else 0.0
    return GenerationMetrics(
        prompt_tokens=prompt_tokens,
        generated_tokens=n,
        ttft_ms=((first - start) * 1e3) if first is not None else 0.0,
        prefill_tokens_per_s=prompt_tokens / prefill_s,
        decode_tokens_per_s=(len(gaps) / decode_s) if decode_s > 0 else 0.0,
        tpot_ms_p50=stats["p50"] if stats else None,
        tpot_ms_p99=stats["p99"] if stats else None,
        total_ms=(end - start) * 1e3,
        peak_rss_bytes=peak_rss,
        kv_cache_bytes=kv_cache_bytes,
        others_busy_cpus=others_busy_cpus(cpu_at_start, cpu_sample()),
    )
