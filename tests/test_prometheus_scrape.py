"""A real Prometheus (Debian's ``prometheus`` package) scrapes a real ``edgeinfer serve`` under load every second;
the counters and histograms read back through Prometheus's HTTP API match what the clients saw, and every
query of the Grafana dashboard is valid PromQL to a real Prometheus."""

from __future__ import annotations

import pytest
from dashboard import panels, queries

from edgeinfer.serve.metrics import LATENCY_BUCKETS
from edgeinfer.testing import prometheus
from edgeinfer.testing.serve import ServerProc, minilm_bundle

pytestmark = [pytest.mark.slow,  # converts MiniLM once, starts a server and Prometheus
              pytest.mark.skipif(prometheus.binary() is None,
                                 reason="no prometheus binary on PATH: apt-get install --no-install-recommends "
                                        "prometheus (make dev does it where apt-get exists)")]

CLIENTS, SECONDS = 4, 6.0


def readbacks(load: prometheus.EmbeddingLoad) -> dict[str, float]:
    """PromQL → the value the clients' own counts say it must have once Prometheus has scraped the end state.
    Decoder serving adds its rows here: generated tokens (the sum of ``usage.completion_tokens``), TTFT
    observations (one per stream)."""
    ok = load.statuses.count(200)
    return {
        'sum(edgeinfer_requests_total{endpoint="/v1/embeddings", status="200"})': ok,
        'sum(edgeinfer_request_latency_seconds_count{endpoint="/v1/embeddings"})': len(load.statuses),
        'sum(edgeinfer_batch_requests_sum{model="minilm-ort"})': len(load.statuses),
    }


@pytest.fixture(scope="module")
def scraped(minilm_onnx, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "serve-bundles"  # shared with the other serve tests
    bundle = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    work = tmp_path_factory.mktemp("prometheus")
    with ServerProc([bundle], "--batch-window-ms", "5", log=work / "server.log") as server, \
            prometheus.PrometheusProc([f"127.0.0.1:{server.port}"], work / "prom") as prom:
        prom.wait_value('up{job="edgeinfer"}', lambda v: v == 1)
        load = prometheus.EmbeddingLoad(server.url, CLIENTS).run(SECONDS)
        yield prom, load


def test_counters_read_back_through_prometheus_equal_the_clients_counts(scraped):
    prom, load = scraped
    assert load.statuses and set(load.statuses) == {200}
    for expr, expected in readbacks(load).items():
        assert prom.wait_value(expr, lambda v, e=expected: v == e) == expected, expr


def test_latency_histogram_quantiles_are_bounded_by_what_the_clients_measured(scraped):
    prom, load = scraped
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
    prom, _ = scraped
    rss = prom.query("edgeinfer_process_rss_bytes")
    assert {r["metric"]["process"] for r in rss} == {"server", "worker0"}
    assert all(float(r["value"][1]) > 10 * 2**20 for r in rss)


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_dashboard_queries_are_valid_promql(scraped, panel):
    prom, _ = scraped
    for expr in queries(panel):
        prom.query(expr.replace("$__rate_interval", "1m").replace("$model", ".*"))  # raises on a parse error
