"""deploy/grafana/edgeinfer-dashboard.json: every panel's PromQL names only metrics the server exports, read from
a live /metrics of a real server (MiniLM, onnxruntime) and from the metrics module's own registry."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from dashboard import DASHBOARD, declared_families, metric_names, panels, queries, series_names
from prometheus_client import generate_latest

from edgeinfer.fleet.health import FleetState
from edgeinfer.serve import metrics as metrics_module
from edgeinfer.serve.device_gauges import NAMES as DEVICE_GAUGES
from edgeinfer.testing.serve import ServerProc, minilm_bundle

pytestmark = pytest.mark.slow  # starts a real server


@pytest.fixture(scope="module")
def live_families(minilm_onnx, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.getbasetemp() / "serve-bundles"  # shared with the other serve tests
    bundle = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    with ServerProc([bundle], log=tmp_path_factory.mktemp("grafana") / "server.log") as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": ["a sentence to count"]}, timeout=60)
        assert r.status_code == 200
        return declared_families(httpx.get(s.url + "/metrics", timeout=30).text)


@pytest.fixture(scope="module")
def exported(live_families) -> set[str]:
    registered = declared_families(generate_latest(metrics_module.Metrics().registry).decode())
    return series_names({**live_families, **registered, **fleet_families()})


def fleet_families() -> dict[str, str]:
    """What the router of `serve --ray` adds about the fleet itself, from its collector with one node, unit,
    replica and refusal filled in (no Ray needed)."""
    from prometheus_client import CollectorRegistry

    state = FleetState("edgeinfer")
    state.nodes = [{"node": "n1", "address": "10.0.0.2", "alive": True}]
    state.units = {"rk3588_npu": 1.0}
    state.replicas = {"bundle-m": {"RUNNING": 1}}
    state.refused("m", "n1", "10.0.0.2", "sha256 mismatch")
    registry = CollectorRegistry()
    registry.register(state)
    return declared_families(generate_latest(registry).decode())


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.99, sum by (le, endpoint) (rate(a_bucket{endpoint!~"/x|/y"}[5m])))') \
        == {"a_bucket"}
    assert metric_names("sum(rate(b_sum[$__rate_interval])) / sum without (x) (rate(c_count[1m]))") \
        == {"b_sum", "c_count"}
    assert metric_names('d{status=~"4..|5.."} and on (model) e > bool 0.5') == {"d", "e"}
    assert metric_names("label_replace(up, \"a\", \"$1\", \"b\", \"(.*)\")") == {"up"}


def test_live_server_exports_device_gauges_and_embedding_metrics(live_families):
    for name in (*DEVICE_GAUGES, "edgeinfer_requests_total", "edgeinfer_request_latency_seconds"):
        assert name in live_families, name


def test_dashboard_covers_the_operator_views():
    names = set().union(*(metric_names(q) for p in panels() for q in queries(p)))
    wanted = {"edgeinfer_request_ttft_seconds_bucket", "edgeinfer_request_tpot_seconds_bucket",
              "edgeinfer_request_e2e_seconds_bucket", "edgeinfer_generation_tokens_total",
              "edgeinfer_prompt_tokens_total", "edgeinfer_sequences_running", "edgeinfer_sequences_waiting",
              "edgeinfer_kv_slots_used", "edgeinfer_kv_slots_total", "edgeinfer_requests_total",
              "edgeinfer_request_latency_seconds_bucket", *DEVICE_GAUGES}
    assert wanted <= names, wanted - names


def test_fleet_panels_show_every_device_gauge_per_node_and_replica():
    """The router of `serve --ray` labels each replica's gauges with node and replica (edgeinfer/fleet/metrics.py):
    the fleet row's panels select only Ray replicas' series and break them down by node."""
    top = json.loads(DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(top) if p["type"] == "row" and p["title"].startswith("Fleet"))
    fleet = [q for p in top[start + 1:] if p["type"] != "row" for q in queries(p)]
    gauges = [q for q in fleet if "edgeinfer_fleet_" not in q]
    assert set(DEVICE_GAUGES) <= set().union(*(metric_names(q) for q in gauges))
    for q in gauges:
        assert 'replica=~".+#.+"' in q and re.search(r"by \((node|[^)]*, node)\b", q), q
    assert any(re.search(r"by \([^)]*\breplica\b", q) for q in gauges)


def test_fleet_panels_show_nodes_units_replicas_and_refusals():
    """The router's fleet collector (edgeinfer/fleet/health.py): what a lost node, a replica Serve cannot place
    and a refused bundle copy look like on the dashboard."""
    top = json.loads(DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(top) if p["type"] == "row" and p["title"].startswith("Fleet"))
    names = set().union(*(metric_names(q) for p in top[start + 1:] if p["type"] != "row" for q in queries(p)))
    assert {"edgeinfer_fleet_node_up", "edgeinfer_fleet_resource_units", "edgeinfer_fleet_replicas",
            "edgeinfer_fleet_bundle_refusals_total"} <= names


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_every_panel_names_exported_metrics(panel, exported):
    names = set().union(*(metric_names(q) for q in queries(panel)))
    assert names, f"panel {panel['title']!r} selects no metric"
    missing = names - exported
    assert not missing, f"panel {panel['title']!r} names metrics the server does not export: {sorted(missing)}"
