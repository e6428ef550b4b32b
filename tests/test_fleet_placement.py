"""The placement `serve --ray` chooses, without Ray: `serve --ray --dry-run` against `plan --fleet` for the same
bundle and board, and the fractional share of an accelerator each replica asks for (edgeinfer/fleet/fit.py).

Expected shares are worked out here from the replica counts: a unit whose memory holds k replicas gives each
1/k of itself, rounded down to Ray's 4 decimal places, so that exactly k of them fit in one unit."""

from __future__ import annotations

import json
import math
import os

import pytest
from helpers import labelled_bundle, npu_test_board

from edgeinfer.errors import BackendUnavailableError
from edgeinfer.fleet.fit import capacity, per_node, share
from edgeinfer.fleet.ray_serve import BundleTarget, check_resources
from edgeinfer.planning.fleet import Placement
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()
SLOTS = 2


def _placement(per_node: int, units: int = 1) -> Placement:
    return Placement(model="m", board="b", nodes=1, fits=True, replicas_per_node=per_node, replicas_total=per_node,
                     units=units, per_replica_bytes=2**30, pool_bytes=per_node * 2**30, quant="fp32", runtime="r")


def _node(cpus: float, **resources: float) -> dict:
    return {"Alive": True, "Resources": {"CPU": cpus, **resources}}


def test_a_replica_asks_for_its_share_of_one_unit_so_a_unit_holds_as_many_as_its_memory_fits():
    seven = _placement(7)  # one unit (shared memory) that holds 7 replicas
    assert share(seven) == 0.1428 and 7 * share(seven) <= 1 < 8 * share(seven)
    assert per_node(1, seven) == 7 and capacity("intel_npu", seven, [_node(16, intel_npu=1)], 0.5) == 7
    assert capacity("intel_npu", seven, [_node(2, intel_npu=1)], 0.5) == 4  # 2 CPUs / 0.5 CPU per replica
    # 2 units that advertise more than the board's memory holds: the plan bounds the node, not the units
    assert per_node(2, seven) == 7
    duo = _placement(6, units=2)  # dedicated memory on 2 chips, 3 replicas on each
    assert share(duo) == 0.3333 and per_node(2, duo) == 6 and per_node(1, duo) == 3
    assert capacity("npu", duo, [_node(16, npu=2), _node(16, npu=2), {**_node(16, npu=2), "Alive": False}],
                    0.5) == 12
    # one replica per unit, or nothing planned (an embedding bundle): a whole unit each, as before
    assert share(_placement(1)) == 1.0 and share(None) == 1.0 and per_node(3, None) == 3
    assert share(_placement(20_000)) == 0.0001  # never 0 (no constraint at all): Ray's smallest amount


def test_fractional_replicas_are_refused_only_past_the_cluster_units():
    t = BundleTarget("m", "/x", "intel_npu", {}, embeds=False, decoder=True, plan=_placement(7))
    check_resources([t], 7, {"intel_npu": 1.0}, "here")  # 7 × 0.1428 fits one unit
    with pytest.raises(BackendUnavailableError, match=r"m needs 1.1424 × Ray resource 'intel_npu' \(8 replica"):
        check_resources([t], 8, {"intel_npu": 1.0}, "here")


@pytest.fixture(scope="module")
def npu_decoder(tiny_qwen3_host_bundle, tmp_path_factory):
    """The session's tiny-qwen3 bundle labelled for a test board with the `intel_npu` resource, and that board."""
    root = tmp_path_factory.mktemp("placement")
    board = npu_test_board(root / "npu-roomy.yaml")
    return labelled_bundle(tiny_qwen3_host_bundle, root / "tiny-qwen3-npu", board), board


def test_dry_run_placement_agrees_with_plan_fleet(npu_decoder, tmp_path):
    bundle, board = npu_decoder
    model = {"model": str(bundle / "tokenizer" / "config.json"), "quant": "fp32", "ctx": 256, "slots": SLOTS}
    (tmp_path / "fleet.yaml").write_text(json.dumps({"nodes": [{"board": board}], "models": [model]}))
    plan = cli("plan", "--fleet", str(tmp_path / "fleet.yaml"), "--json")
    assert plan.returncode == 0, plan.stderr
    [planned] = json.loads(plan.stdout)["placements"]
    # an address is not joined by a dry run: nothing listens at this one
    proc = cli("serve", str(bundle), "--ray", "127.0.0.1:9", "--slots", str(SLOTS), "--replicas", "2",
               "--max-replicas", "3", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    [d] = report["deployments"]
    k = planned["replicas_per_node"] // planned["units"]
    assert planned["units"] == 1 and k >= 2  # the case tests more than one replica per unit
    assert d["deployment"] == "bundle-tiny-qwen3-npu" and d["model"] == "tiny-qwen3-npu" and d["decoder"]
    assert d["resources"] == {"CPU": 0.5, "intel_npu": math.floor(10_000 / k) / 10_000}
    assert d["replicas"] == {"min": 2, "max": 3, "autoscaling": True}
    assert d["nodes"] == {"resource": "intel_npu", "board": "npu-roomy", "replicas_per_node":
                          planned["replicas_per_node"], "per_replica_bytes": planned["per_replica_bytes"]}
    text = cli("serve", str(bundle), "--ray", "127.0.0.1:9", "--slots", str(SLOTS), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert text.stdout == (f"bundle-tiny-qwen3-npu: 1 replica(s), each 0.5 CPU + {d['resources']['intel_npu']:g} "
                           f"intel_npu; on nodes with intel_npu, at most {planned['replicas_per_node']} per "
                           "npu-roomy node by the plan\n")


def test_dry_run_on_this_machine_bounds_autoscaling_by_its_cpus_and_starts_no_ray(tiny_qwen3_host_bundle):
    proc = cli("serve", str(tiny_qwen3_host_bundle), "--ray", "auto", "--replicas", "auto", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    held = int(os.cpu_count() / 0.5)  # a CPU bundle: this machine's CPUs over 0.5 CPU per replica
    assert proc.stdout == f"bundle-tiny-qwen3-host: 1-{held} (autoscaling) replica(s), each 0.5 CPU; on any node\n"
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()


def test_dry_run_without_ray_is_refused_one_line(tiny_qwen3_host_bundle):
    proc = cli("serve", str(tiny_qwen3_host_bundle), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --dry-run shows the placement of --ray"), proc.stderr


def test_the_autoscalers_timing_is_settable_from_the_environment(monkeypatch, tiny_qwen3_host_bundle):
    """EDGEINFER_RAY_AUTOSCALING overrides Serve's autoscaler timing (edgeinfer/fleet/router.py); anything but a
    JSON object of seconds >= 0 under the timing keys is refused before anything starts (exit 2, one line)."""
    from edgeinfer.errors import InputError
    from edgeinfer.fleet.router import AUTOSCALING_ENV, scaling

    monkeypatch.delenv(AUTOSCALING_ENV, raising=False)
    plain = scaling(1, 2, SLOTS)["autoscaling_config"]
    assert (plain["upscale_delay_s"], plain["downscale_delay_s"]) == (10.0, 120.0)
    assert "look_back_period_s" not in plain  # Serve's own default
    monkeypatch.setenv(AUTOSCALING_ENV, '{"downscale_delay_s": 3, "look_back_period_s": 0.5}')
    timed = scaling(1, 2, SLOTS)["autoscaling_config"]
    assert timed == {**plain, "downscale_delay_s": 3.0, "look_back_period_s": 0.5}
    assert scaling(2, None, SLOTS) == {"num_replicas": 2}  # fixed replicas: no autoscaler to time
    monkeypatch.setenv(AUTOSCALING_ENV, '{"upscale_delay_s": 0}')
    assert scaling(1, 2, SLOTS)["autoscaling_config"]["upscale_delay_s"] == 0
    for bad in ('{"min_replicas": 5}', '{"upscale_delay_s": -1}', '{"upscale_delay_s": true}',
                '{"look_back_period_s": 0}', "[1]", "10"):
        monkeypatch.setenv(AUTOSCALING_ENV, bad)
        with pytest.raises(InputError, match=AUTOSCALING_ENV):
            scaling(1, 2, SLOTS)
    proc = cli("serve", str(tiny_qwen3_host_bundle), "--ray", "auto", "--replicas", "auto", "--dry-run")
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {AUTOSCALING_ENV}='10' is not a JSON object"), \
        proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("interrupted_in", ["start_serve", "ship_from_here"])
def test_an_interrupt_while_serve_starts_still_stops_what_it_started(monkeypatch, interrupted_in):
    """Ctrl-C (or SIGTERM, exit 143) while Ray Serve or the bundle store is being started on a joined cluster:
    the command's cleanup still shuts down the Serve it was starting and looks for its store by name (before,
    ``owner`` was only set once ``serve.start`` had returned, and Serve kept running after the CLI had said
    "nothing was left behind")."""
    import ray

    from edgeinfer.fleet import ray_serve
    from edgeinfer.serve.config import ServeConfig

    stops = []

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_serve, "require_ray", lambda: None)
    monkeypatch.setattr(ray_serve, "targets", lambda paths, config: [])
    monkeypatch.setattr(ray_serve, "connect", lambda address: False)  # joined a running cluster
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "nodes", lambda: [])
    monkeypatch.setattr(ray_serve, "serve_running", lambda: False)
    monkeypatch.setattr(ray_serve, "start_serve", interrupt if interrupted_in == "start_serve" else
                        lambda host, port, fresh: None)
    monkeypatch.setattr(ray_serve, "ship_from_here", interrupt)
    monkeypatch.setattr(ray_serve, "stop", lambda *args: stops.append(args))
    with pytest.raises(KeyboardInterrupt):
        ray_serve.serve_on_ray(ServeConfig(bundles=[], port=8123), "ray://head:10001")
    assert len(stops) == 1
    started, owner, deployed, store = stops[0]
    assert (started, owner, deployed) == (False, True, False)
    if interrupted_in == "ship_from_here":  # the store's creation began: stop() looks for it
        assert store.startswith("edgeinfer-bundles-")
    else:  # never begun: nothing to wait for
        assert store == ""


def test_a_store_still_registering_when_stop_looks_is_found_and_killed(monkeypatch):
    """An interrupt in the middle of the store's creation: its name may appear a moment later; kill_store looks
    again until it does (or, for a store that never came, gives up after wait_s)."""
    import ray

    from edgeinfer.fleet import ray_serve

    lookups, killed = [], []

    def get_actor(name, namespace=None):
        lookups.append(name)
        if len(lookups) < 3:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return f"handle of {name}"

    monkeypatch.setattr(ray, "get_actor", get_actor)
    monkeypatch.setattr(ray, "kill", killed.append)
    ray_serve.kill_store("edgeinfer-bundles-x", wait_s=5.0)
    assert killed == ["handle of edgeinfer-bundles-x"] and len(lookups) == 3
    lookups.clear()

    def never(name, namespace=None):
        lookups.append(name)
        raise ValueError(f"Failed to look up actor with name '{name}'")

    monkeypatch.setattr(ray, "get_actor", never)
    ray_serve.kill_store("edgeinfer-bundles-y", wait_s=0.25)
    assert killed == ["handle of edgeinfer-bundles-x"] and 2 <= len(lookups) <= 5
