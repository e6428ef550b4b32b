"""Accelerators as Ray custom resources: naming rule, merging backends' findings into node resources and
labels, and the `ray start` line `edgeinfer ray-node` runs. Accelerators here are written by hand (the
plugins' own tests derive them from probes of stand-ins for absent NPUs)."""

from __future__ import annotations

import functools
import json
import shlex

import pytest
from helpers import HEAVY, imported_modules

from edgeinfer.contract.resources import Accelerator
from edgeinfer.fleet.node import start_command
from edgeinfer.fleet.resources import merge
from edgeinfer.testing.cli import run_cli

GIB = 2**30


@pytest.fixture
def cli(capfd):
    """``edgeinfer ARGS`` in this process (edgeinfer.testing.cli.run_cli): what the command answers."""
    return functools.partial(run_cli, capfd)


@pytest.mark.parametrize("name", ["ascend_310p", "rk3588_npu", "intel_npu", "acme_tpu2"])
def test_valid_names(name):
    assert Accelerator(name, 1).resource == name


@pytest.mark.parametrize("name", ["NPU", "ascend-310p", "npu", "intel_npu ", "_npu", "memory"])
def test_invalid_names_say_the_rule(name):
    with pytest.raises(ValueError, match="<vendor or soc>_<unit>|Ray's own"):
        Accelerator(name, 1)


def test_count_must_be_positive():
    with pytest.raises(ValueError, match="count must be >= 1"):
        Accelerator("intel_npu", 0)


def test_merge_counts_and_labels():
    found = [
        ("ascend", Accelerator("ascend_910b", 8, 64 * GIB, "npu-smi info")),
        ("openvino", Accelerator("intel_gpu", 1)),
        ("other", Accelerator("ascend_910b", 2, 64 * GIB)),  # the same chips through a second backend: once
    ]
    node = merge(found, host_memory_bytes=512 * GIB)
    assert node.resources == {"ascend_910b": 8, "intel_gpu": 1}
    assert node.labels == {"edgeinfer.io/memory-mb": "524288", "edgeinfer.io/ascend_910b-memory-mb": "65536"}
    assert [a["backend"] for a in node.accelerators] == ["ascend", "openvino"]


def test_ray_start_command_for_head_and_worker():
    node = merge([("rknn", Accelerator("rk3588_npu", 1))], host_memory_bytes=16 * GIB)
    head = start_command(node, None, 6380, 2, False)
    assert "--head" in head and "--port=6380" in head and "--num-cpus=2" in head
    assert '--resources={"rk3588_npu": 1}' in head and "--labels=edgeinfer.io/memory-mb=16384" in head
    worker = start_command(node, "10.0.0.1:6379", 6379, None, True)
    assert "--address=10.0.0.1:6379" in worker and "--head" not in worker and worker[-1] == "--block"


def test_ray_resources_and_ray_node_dry_run_on_this_machine(cli):
    proc = cli("ray-resources", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert int(report["labels"]["edgeinfer.io/memory-mb"]) > 0
    dry = cli("ray-node", "--dry-run", "--num-cpus", "1")
    assert dry.returncode == 0, dry.stderr
    args = shlex.split(dry.stdout)
    resources = json.loads(next(a for a in args if a.startswith("--resources=")).split("=", 1)[1])
    assert resources == report["resources"]


def test_fleet_resources_import_is_light():
    heavy = imported_modules("import edgeinfer.fleet.resources, edgeinfer.fleet.node, edgeinfer.cli.fleet")
    assert not heavy & (set(HEAVY) | {"ray"})



def test_serve_ray_refuses_options_it_does_not_honour(tmp_path, cli):
    from edgeinfer.errors import InputError
    from edgeinfer.fleet.ray_serve import check_options, parse_scale
    from edgeinfer.serve.config import ServeConfig

    proc = cli("serve", str(tmp_path), "--ray", "auto", "--devices", "0,1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --devices does not go with --ray")
    assert proc.stderr.count("\n") == 1
    with pytest.raises(InputError, match="--devices"):
        check_options(ServeConfig([tmp_path], devices=["0", "1"]))
    check_options(ServeConfig([tmp_path], api_key="k"))  # the router checks keys (tests/test_fleet_ray.py)
    with pytest.raises(InputError, match="--replicas must be at least 1"):
        parse_scale("0", None)


def test_without_ray_the_ray_commands_exit_3_with_the_install_line(tmp_path):
    import subprocess
    import sys

    for args in (["ray-node", "--num-cpus", "1"], ["serve", str(tmp_path), "--ray", "auto"]):
        code = f"import sys\nsys.modules['ray'] = None\nfrom edgeinfer.cli import main\nmain({args!r})"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert r.returncode == 3, r.stderr
        assert r.stderr.count("\n") == 1 and "pip install 'edgeinfer[fleet]'" in r.stderr, r.stderr


def test_replicas_auto_and_max_replicas_parse_to_a_scale(tmp_path, cli):
    from edgeinfer.errors import InputError
    from edgeinfer.fleet.ray_serve import Scale, parse_scale

    assert parse_scale("3", None) == Scale(3, None, False)
    assert parse_scale("auto", None) == Scale(1, None, True)
    assert parse_scale("2", 5) == Scale(2, 5, True) and parse_scale("2", 5).wanted == 5
    with pytest.raises(InputError, match="below --replicas 3"):
        parse_scale("3", 2)
    proc = cli("serve", str(tmp_path), "--ray", "auto", "--replicas", "many")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "'many'" in proc.stderr, proc.stderr


def test_router_metrics_merge_replica_registries_with_a_replica_label(monkeypatch):
    from prometheus_client import CollectorRegistry, Counter, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from edgeinfer.fleet import metrics as fleet_metrics

    def registry(tokens: float) -> CollectorRegistry:
        r = CollectorRegistry()
        Counter("edgeinfer_generation_tokens", "Tokens generated.", ["model"], registry=r).labels("m").inc(tokens)
        return r

    merged = fleet_metrics.ReplicaMetrics(registry(0))
    merged.push("bundle-m#a", generate_latest(registry(5)).decode())
    merged.push("bundle-m#b", generate_latest(registry(7)).decode())
    families = [f for f in text_string_to_metric_families(merged.exposition().decode())
                if f.name == "edgeinfer_generation_tokens"]
    assert len(families) == 1  # one family, not one per replica
    totals = {s.labels["replica"]: s.value for s in families[0].samples if s.name.endswith("_total")}
    assert totals == {"router": 0.0, "bundle-m#a": 5.0, "bundle-m#b": 7.0}
    monkeypatch.setattr(fleet_metrics, "STALE_S", -1.0)  # every push is now too old
    assert "bundle-m#a" not in merged.exposition().decode()


def test_fleet_capacity_per_node_is_the_least_of_units_cpus_and_the_plan():
    from types import SimpleNamespace

    from edgeinfer.fleet.fit import capacity

    nodes = [{"Alive": True, "Resources": {"CPU": 1.0}},
             {"Alive": True, "Resources": {"CPU": 1.0, "intel_npu": 2.0}},  # 2 units, CPUs for 2 replicas of 0.5
             {"Alive": True, "Resources": {"CPU": 0.5, "intel_npu": 4.0}},  # 4 units, CPU for 1
             {"Alive": False, "Resources": {"CPU": 8.0, "intel_npu": 8.0}}]  # a dead node holds nothing
    assert capacity("intel_npu", None, nodes, 0.5) == 2 + 1
    assert capacity("intel_npu", SimpleNamespace(replicas_per_node=1, units=1, fits=True), nodes, 0.5) == 1 + 1
    assert capacity(None, None, nodes, 0.5) == 2 + 2 + 1
    assert capacity("rk3588_npu", None, nodes, 0.5) == 0
