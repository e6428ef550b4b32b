"""The /metrics device gauges collector: readers called lazily at scrape time, cached, a failing reader dropped
without failing the scrape. Readings come from the RKNN plugin's real parser on recorded driver output
(plugins/rknn/tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import os
from pathlib import Path

from edgeinfer_rknn import gauges as rknn_gauges
from prometheus_client import CollectorRegistry, generate_latest

from edgeinfer.serve.device_gauges import NAMES, DeviceGauges

FIXTURES = Path(__file__).resolve().parents[1] / "plugins/rknn/tests/fixtures"


def _rk3588(root: Path, fixture: str) -> Path:
    f = root / "sys/kernel/debug/rknpu/load"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text((FIXTURES / fixture).read_text())
    return root


def _scrape(collector: DeviceGauges) -> dict[str, float]:
    reg = CollectorRegistry()
    reg.register(collector)
    out = {}
    for line in generate_latest(reg).decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_readings_become_labelled_gauges_and_rss_is_always_there(tmp_path):
    board = _rk3588(tmp_path, "recorded_rknpu_load_rk3588_mixed.txt")
    got = _scrape(DeviceGauges({"rknn": lambda: rknn_gauges.readings(board)}))
    assert got['edgeinfer_device_utilization_ratio{device="rknn:core0"}'] == 0.21
    assert got['edgeinfer_device_utilization_ratio{device="rknn:core2"}'] == 0.0
    assert not any(k.startswith("edgeinfer_device_memory") for k in got)  # the RKNPU reports no memory
    rss = got['edgeinfer_process_rss_bytes{process="server"}']
    assert 10 * 2**20 < rss < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_failing_or_absent_source_never_fails_the_scrape(tmp_path):
    garbage = tmp_path / "garbage"
    (garbage / "sys/kernel/debug/rknpu").mkdir(parents=True)
    (garbage / "sys/kernel/debug/rknpu/load").write_text("Permission denied\n")
    board = _rk3588(tmp_path / "ok", "recorded_rknpu_load_rk3588_busy.txt")
    got = _scrape(DeviceGauges({"broken": lambda: rknn_gauges.readings(garbage),
                                "absent": lambda: rknn_gauges.readings(tmp_path / "nothing"),
                                "rknn": lambda: rknn_gauges.readings(board)}))
    devices = sorted(k for k in got if k.startswith("edgeinfer_device_utilization_ratio"))
    assert devices == [f'edgeinfer_device_utilization_ratio{{device="rknn:core{i}"}}' for i in range(3)]


def test_readers_are_called_at_most_once_per_ttl(tmp_path):
    board = _rk3588(tmp_path, "recorded_rknpu_load_rk3588_mixed.txt")
    calls = []

    def counting():
        calls.append(1)
        return rknn_gauges.readings(board)

    cached = DeviceGauges({"rknn": counting}, ttl_s=3600)
    _scrape(cached), _scrape(cached)
    assert len(calls) == 1
    # a new driver figure shows once the cache has expired
    _rk3588(tmp_path, "recorded_rknpu_load_rk3588_busy.txt")
    fresh = DeviceGauges({"rknn": counting}, ttl_s=0)
    assert _scrape(fresh)['edgeinfer_device_utilization_ratio{device="rknn:core1"}'] == 0.65


def test_worker_processes_get_their_own_rss():
    got = _scrape(DeviceGauges({}, processes=lambda: {"worker0": os.getppid(), "gone": 2**22 + 12345}))
    assert got['edgeinfer_process_rss_bytes{process="worker0"}'] > 0
    assert not any('process="gone"' in k for k in got)  # no such pid: left out, no error


def test_every_declared_name_is_exported(tmp_path):
    class Full:  # a complete reading, as npu-smi gives for a 910B chip
        def __call__(self):
            from edgeinfer.contract.backend import DeviceReading

            return [DeviceReading("0.0", utilization=0.5, memory_used_bytes=1.0, memory_total_bytes=2.0)]

    names = {k.split("{")[0] for k in _scrape(DeviceGauges({"x": Full()}))}
    assert names == set(NAMES)



def test_the_ray_router_labels_every_replicas_device_gauges_by_node_and_replica(tmp_path, monkeypatch):
    """Two replicas on two nodes push registries with the gauges a replica registers (replicas.device_gauges:
    the RKNN backend's own reader, pointed at recorded driver output as no RKNPU is here): the router's
    /metrics has one family per gauge and a series per node, replica and device."""
    from prometheus_client.parser import text_string_to_metric_families

    from edgeinfer.fleet.metrics import ReplicaMetrics
    from edgeinfer.fleet.replicas import device_gauges
    from edgeinfer.serve.metrics import Metrics

    read = rknn_gauges.readings

    def replica(fixture: str) -> str:
        board = _rk3588(tmp_path / fixture, fixture)
        monkeypatch.setattr(rknn_gauges, "readings", lambda root=board: read(root))
        registry = Metrics().registry
        device_gauges(registry, "rknn", lambda: {"decoder": os.getppid()})
        return generate_latest(registry).decode()

    own = Metrics()
    own.requests.labels("/metrics", "200").inc()
    router = ReplicaMetrics(own.registry, node="node-head")
    router.push("bundle-a#1", replica("recorded_rknpu_load_rk3588_mixed.txt"), node="node-a")
    router.push("bundle-b#2", replica("recorded_rknpu_load_rk3588_busy.txt"), node="node-b")
    families = {f.name: f for f in text_string_to_metric_families(router.exposition().decode())}
    util = {(s.labels["node"], s.labels["replica"], s.labels["device"]): s.value
            for s in families["edgeinfer_device_utilization_ratio"].samples}
    assert util == {**{("node-a", "bundle-a#1", f"rknn:core{i}"): v for i, v in enumerate((0.21, 0.11, 0.0))},
                    **{("node-b", "bundle-b#2", f"rknn:core{i}"): v for i, v in enumerate((0.63, 0.65, 0.64))}}
    rss = {(s.labels["node"], s.labels["replica"], s.labels["process"]): s.value
           for s in families["edgeinfer_process_rss_bytes"].samples}
    assert set(rss) == {(n, r, p) for n, r in (("node-a", "bundle-a#1"), ("node-b", "bundle-b#2"))
                        for p in ("server", "decoder")} and min(rss.values()) > 0
    assert [(s.labels["node"], s.labels["replica"]) for s in families["edgeinfer_requests"].samples
            if s.name == "edgeinfer_requests_total"] == [("node-head", "router")]
