"""A real Prometheus (Debian's ``prometheus`` package) scrapes a real ``edgeinfer serve`` (an embedding bundle
and the tiny decoder, one server) under load every second; the counters and histograms read back through
Prometheus's HTTP API match what the clients saw, and every query of the Grafana dashboard is valid PromQL to a
real Prometheus."""

from __future__ import annotations

import pytest
from dashboard import panels, queries

from edgeinfer.serve.metrics import LATENCY_BUCKETS
from edgeinfer.testing import prometheus
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc, minilm_bundle

pytestmark = [pytest.mark.slow,  # converts MiniLM once, starts a server and Prometheus
              pytest.mark.skipif(prometheus.binary() is None,
                                 reason="no prometheus binary on PATH: apt-get install --no-install-recommends "
                                        "prometheus (make dev does it where apt-get exists)")]

CLIENTS, SECONDS = 4, 4.0  # four scrapes of the load at least: enough for every read-back and rate
MAX_TOKENS = 12


def readbacks(load: prometheus.EmbeddingLoad, streams: prometheus.DecoderLoad) -> dict[str, float]:
    """PromQL → the value the clients' own counts say it must have once Prometheus has scraped the end state:
    embedding requests; for the decoder, one TTFT and one end-to-end observation per stream and the generated
    tokens (the sum of the streams' ``usage.completion_tokens``)."""
    ok = load.statuses.count(200)
    return {
        'sum(edgeinfer_requests_total{endpoint="/v1/embeddings", status="200"})': ok,
        'sum(edgeinfer_request_latency_seconds_count{endpoint="/v1/embeddings"})': len(load.statuses),
        'sum(edgeinfer_batch_requests_sum{model="minilm-ort"})': len(load.statuses),
        'sum(edgeinfer_request_ttft_seconds_count{model="tiny-qwen3"})': len(streams.statuses),
        'sum(edgeinfer_request_e2e_seconds_count{model="tiny-qwen3"})': len(streams.statuses),
        'sum(edgeinfer_generation_tokens_total{model="tiny-qwen3"})': sum(streams.completion_tokens),
    }


@pytest.fixture(scope="module")
def scraped(minilm_onnx, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "serve-bundles"  # shared with the other serve tests
    bundle = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    work = tmp_path_factory.mktemp("prometheus")
    with ServerProc([bundle, model_dir()], "--batch-window-ms", "5", "--slots", "2", "--ctx", "128",
                    "--threads", "1", log=work / "server.log") as server, \
            prometheus.PrometheusProc([f"127.0.0.1:{server.port}"], work / "prom") as prom:
        prom.wait_value('up{job="edgeinfer"}', lambda v: v == 1)
        streams = prometheus.DecoderLoad(server.url, "tiny-qwen3", clients=2, max_tokens=MAX_TOKENS).start()
        load = prometheus.EmbeddingLoad(server.url, CLIENTS).run(SECONDS)
        streams.stop()
        yield prom, load, streams


def test_counters_read_back_through_prometheus_equal_the_clients_counts(scraped):
    prom, load, streams = scraped
    assert load.statuses and set(load.statuses) == {200}
    assert streams.statuses and set(streams.statuses) == {200}
    assert streams.completion_tokens == [MAX_TOKENS] * len(streams.statuses)  # EOS ignored: every token counted
    for expr, expected in readbacks(load, streams).items():
        assert prom.wait_value(expr, lambda v, e=expected: v == e) == expected, expr


def test_decoder_ttft_quantile_is_bounded_by_the_slowest_stream(scraped):
    prom, _, streams = scraped
    bound = next(b for b in LATENCY_BUCKETS if b >= max(streams.latencies))  # TTFT <= the whole stream
    expr = ('histogram_quantile(0.5, sum by (le) '
            '(increase(edgeinfer_request_ttft_seconds_bucket{model="tiny-qwen3"}[1h])))')
    assert 0 < prom.wait_value(expr, lambda v: v > 0) <= bound


def test_latency_histogram_quantiles_are_bounded_by_what_the_clients_measured(scraped):
    prom, load, _ = scraped
    # every server-side latency is below the slowest client round trip, so the histogram's p99 estimate cannot
    # exceed the first bucket bound above it
    bound = next(b for b in LATENCY_BUCKETS if b >= max(load.latencies))
    expr = ('histogram_quantile(0.99, sum by (le) '
            '(increase(edgeinfer_request_latency_seconds_bucket{endpoint="/v1/embeddings"}[1h])))')
    p99 = prom.wait_value(expr, lambda v: v > 0)
    assert 0 < p99 <= bound
    # the load ran for SECONDS: the per-second rate Prometheus computed over it is a real, positive rate
    rate = prom.value('sum(rate(edgeinfer_requests_total{endpoint="/v1/embeddings"}[1h]))')
    assert rate is not None and rate > 0


def test_device_and_process_gauges_reach_prometheus(scraped):
    prom, _, _ = scraped
    rss = prom.query("edgeinfer_process_rss_bytes")
    assert {r["metric"]["process"] for r in rss} == {"server", "worker0"}
    assert all(float(r["value"][1]) > 10 * 2**20 for r in rss)


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_dashboard_queries_are_valid_promql(scraped, panel):
    prom, _, _ = scraped
    for expr in queries(panel):
        prom.query(expr.replace("$__rate_interval", "1m").replace("$model", ".*"))  # raises on a parse error
