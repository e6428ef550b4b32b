"""Prometheus metrics of the service (one registry per app, so tests can run several apps)."""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from edgeinfer.contract.measure import current_rss_bytes
from edgeinfer.serve.device_gauges import DeviceGauges, backend_readers, worker_pids

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
ENDPOINTS = ("/v1/embeddings", "/v1/rerank", "/v2/rerank", "/v1/classify", "/v1/infer", "/v1/chat/completions",
             "/v1/completions", "/v1/models", "/health", "/ready", "/metrics", "/openapi.json", "/docs")


class Metrics:
    def __init__(self, pool: Any = None, backends: list[str] | None = None, queue_depth: Any = None):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("edgeinfer_requests", "HTTP requests by endpoint and status.",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("edgeinfer_request_latency_seconds", "HTTP request latency.", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("edgeinfer_batch_size", "Rows per model run (after merging requests).",
                                    ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram("edgeinfer_batch_requests", "Requests merged into one model run.",
                                        ["model"], buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("edgeinfer_batch_run_seconds", "Time from dispatch to answer of a batch.",
                                       ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_errors = Counter("edgeinfer_batch_errors", "Requests whose model run failed.", ["model"],
                                    registry=r)
        self.worker_crashes = Counter("edgeinfer_worker_crashes", "Batches lost to a worker crash (retried).",
                                      ["model"], registry=r)
        self.worker_restarts = Counter("edgeinfer_worker_restarts", "Worker processes restarted.", ["worker"],
                                       registry=r)
        self.model_requests = Counter("edgeinfer_model_requests", "Requests answered per model (encoder, "
                                      "reranker and classifier endpoints).", ["model", "endpoint"], registry=r)
        self.queue_depth = Gauge("edgeinfer_queue_depth", "Requests waiting for a batch.", ["model"], registry=r)
        self._queue_fn = queue_depth
        self._decoder_metrics(r)
        if pool is not None:
            r.register(DeviceCollector(pool, backends or []))
            devices = [str(w.entry or "") for w in pool.workers]
            r.register(DeviceGauges(backend_readers(backends or [], devices), worker_pids(pool)))

    def observe(self, event: str, **kw: Any) -> None:
        if event == "batch":
            self.batch_size.labels(kw["model"]).observe(kw["rows"])
            self.batch_requests.labels(kw["model"]).observe(kw["requests"])
        elif event == "batch_done":
            self.batch_seconds.labels(kw["model"]).observe(kw["seconds"])
        elif event == "batch_error":
            self.batch_errors.labels(kw["model"]).inc()
        elif event == "model_request":
            self.model_requests.labels(kw["model"], kw["endpoint"]).inc()
        elif event == "crash":
            self.worker_crashes.labels(kw["model"]).inc()
        else:
            self._observe_decoder(event, kw)

    def _decoder_metrics(self, r: CollectorRegistry) -> None:
        """Served decoders; the names follow vLLM's (https://docs.vllm.ai/en/latest/usage/metrics.html) with
        the ``edgeinfer_`` prefix. The Grafana dashboard queries them."""
        self.ttft = Histogram("edgeinfer_request_ttft_seconds", "Time from request arrival to its first token.",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("edgeinfer_request_tpot_seconds", "Mean time per output token after the first, "
                              "per request.", ["model"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("edgeinfer_request_e2e_seconds", "Time from request arrival to its last token.",
                             ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("edgeinfer_prompt_tokens", "Prompt tokens of admitted requests.", ["model"],
                                     registry=r)
        self.generation_tokens = Counter("edgeinfer_generation_tokens", "Tokens generated.", ["model"], registry=r)
        self.running = Gauge("edgeinfer_sequences_running", "Sequences holding a KV slot.", ["model"], registry=r)
        self.waiting = Gauge("edgeinfer_sequences_waiting", "Sequences waiting for a KV slot.", ["model"],
                             registry=r)
        self.slots_used = Gauge("edgeinfer_kv_slots_used", "KV-cache slots in use.", ["model"], registry=r)
        self.slots_total = Gauge("edgeinfer_kv_slots_total", "KV-cache slots reserved at start.", ["model"],
                                 registry=r)

    def _observe_decoder(self, event: str, kw: dict[str, Any]) -> None:
        model = kw.get("model", "")
        if event == "sequences":
            self.running.labels(model).set(kw["running"])
            self.waiting.labels(model).set(kw["waiting"])
            self.slots_used.labels(model).set(kw["running"])
            self.slots_total.labels(model).set(kw["slots"])
        elif event == "prompt":
            self.prompt_tokens.labels(model).inc(kw["tokens"])
        elif event == "generated":
            self.generation_tokens.labels(model).inc(kw["tokens"])
        elif event in ("ttft", "tpot", "e2e"):
            getattr(self, event).labels(model).observe(kw["seconds"])
        elif event == "restart":
            self.worker_restarts.labels(f"llm:{model}").inc()

    def refresh_queue(self) -> None:
        if self._queue_fn is not None:
            for model, depth in self._queue_fn().items():
                self.queue_depth.labels(model).set(depth)


def _numeric_leaves(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _numeric_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _numeric_leaves(v, f"{prefix}.{i}")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append((prefix, float(obj)))
    return out


class DeviceCollector:
    """Worker state and memory, plus every memory/utilisation figure a backend's probe reports
    (``edgeinfer_device_stat{backend, key}``; probed at most every ``ttl_s`` seconds)."""

    def __init__(self, pool: Any, backends: list[str], ttl_s: float = 10.0):
        self.pool = pool
        self.backends = sorted(set(backends))
        self.ttl_s = ttl_s
        self._cache: tuple[float, list[tuple[str, str, float]]] = (0.0, [])
        self._lock = threading.Lock()

    def _device_stats(self) -> list[tuple[str, str, float]]:
        with self._lock:
            t, rows = self._cache
            if time.monotonic() - t < self.ttl_s and t:
                return rows
            rows = []
            from edgeinfer.contract import registry as plugins

            for name in self.backends:
                try:
                    probe = plugins.get_backend(name).probe()
                except Exception:  # noqa: BLE001 - a failing probe must not break the scrape
                    continue
                for key, value in _numeric_leaves(probe.details):
                    low = key.lower()
                    if "mem" in low or "util" in low or "usage" in low:
                        rows.append((name, key, value))
            self._cache = (time.monotonic(), rows)
            return rows

    def collect(self):
        up = GaugeMetricFamily("edgeinfer_worker_up", "1 when the worker is loaded and serving.",
                               labels=["worker", "device"])
        rss = GaugeMetricFamily("edgeinfer_worker_memory_bytes", "Resident memory of the worker process.",
                                labels=["worker", "device"])
        batches = CounterMetricFamily("edgeinfer_worker_batches", "Batches dispatched to the worker.",
                                      labels=["worker", "device"])
        for w in self.pool.workers:
            dev = str(w.entry if w.entry is not None else "default")
            batches.add_metric([str(w.index), dev], float(w.batches))
            up.add_metric([str(w.index), dev], 1.0 if w.state in ("idle", "busy") else 0.0)
            m = current_rss_bytes(w.pid) if w.pid and w.state in ("idle", "busy") else None
            if m is not None:
                rss.add_metric([str(w.index), dev], float(m))
        yield up
        yield rss
        yield batches
        stats = GaugeMetricFamily("edgeinfer_device_stat",
                                  "Device memory/utilisation figures read by the backend's probe.",
                                  labels=["backend", "key"])
        for backend, key, value in self._device_stats():
            stats.add_metric([backend, key], value)
        yield stats
