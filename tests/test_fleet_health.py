"""The router's fleet gauges (edgeinfer/fleet/health.py) in its merged /metrics, without Ray: the readings
``refresh`` takes from Ray's GCS and Serve's controller set by hand (tests/test_fleet_nodes.py reads them from a
real cluster)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from edgeinfer.fleet.health import FleetState, accelerator
from edgeinfer.fleet.metrics import ReplicaMetrics
from edgeinfer.serve.metrics import Metrics


def test_fleet_samples_keep_the_node_they_are_about_on_the_router_metrics(caplog):
    own = Metrics()
    fleet = FleetState("edgeinfer")
    own.registry.register(fleet)
    fleet.nodes = [{"node": "head", "address": "10.0.0.1", "alive": True},
                   {"node": "lost", "address": "10.0.0.3", "alive": False}]
    fleet.units = {"rk3588_npu": 1.0}
    fleet.replicas = {"bundle-minilm": {"RUNNING": 1, "PENDING_ALLOCATION": 1}}
    with caplog.at_level("WARNING", logger="ray.serve"):
        fleet.refused("minilm", "node-b", "10.0.0.2", "model.onnx: sha256 differs")
        fleet.refused("minilm", "node-b", "10.0.0.2", "model.onnx: sha256 differs")
    text = ReplicaMetrics(own.registry, node="head").exposition().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples
               if s.name.startswith("edgeinfer_fleet")}
    assert samples == {
        ("edgeinfer_fleet_node_up", (("address", "10.0.0.1"), ("node", "head"), ("replica", "router"))): 1.0,
        ("edgeinfer_fleet_node_up", (("address", "10.0.0.3"), ("node", "lost"), ("replica", "router"))): 0.0,
        ("edgeinfer_fleet_resource_units", (("node", "head"), ("replica", "router"),
                                            ("resource", "rk3588_npu"))): 1.0,
        ("edgeinfer_fleet_replicas", (("model", "minilm"), ("node", "head"), ("replica", "router"),
                                      ("state", "PENDING_ALLOCATION"))): 1.0,
        ("edgeinfer_fleet_replicas", (("model", "minilm"), ("node", "head"), ("replica", "router"),
                                      ("state", "RUNNING"))): 1.0,
        ("edgeinfer_fleet_bundle_refusals_total", (("bundle", "minilm"), ("node", "node-b"),
                                                   ("replica", "router"))): 2.0,
    }
    assert [r.getMessage() for r in caplog.records] == [
        "node node-b (10.0.0.2) refused its copy of bundle minilm: model.onnx: sha256 differs"] * 2


def test_only_accelerator_resources_count_as_units():
    ray_own = ["CPU", "GPU", "memory", "object_store_memory", "node:10.0.0.1", "node:__internal_head__",
               "accelerator_type:A100"]
    assert [r for r in ray_own + ["rk3588_npu", "intel_npu", "ascend_310p"] if accelerator(r)] == [
        "rk3588_npu", "intel_npu", "ascend_310p"]
