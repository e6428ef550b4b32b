"""`edgeinfer serve --ray` on a local Ray cluster on loopback: a head and one more node started here, the second
advertising a fake `intel_npu` resource (no Intel NPU on this machine). The bundle is the real MiniLM bundle,
its manifest labelled for a board whose replicas need that resource (core-ultra-155h → intel_npu) or one
that no node has (rk3588-8g → rk3588_npu). One replica of two is killed under load (SIGKILL)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from edgeinfer.run.bundle import read_manifest, write
from edgeinfer.testing.serve import ServerProc, free_port, minilm_bundle

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'edgeinfer[fleet]'")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow
RAY_DAEMONS = ("raylet", "gcs_server")
TEXTS = ["a fleet of edge boards", "one endpoint for every board", "x"]


def _labelled(src, dst, board: str):
    shutil.copytree(src, dst)
    write(dst, dataclasses.replace(read_manifest(dst), board=board, files={}))
    return dst


def _ray_daemons() -> set[int]:
    """The Ray daemons this test process started (its descendants), by pid."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if any(d in " ".join(p.cmdline()) for d in RAY_DAEMONS)}


@pytest.fixture(scope="module")
def bundles(minilm_onnx, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-bundles")
    ort = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    return {"host": ort, "npu": _labelled(ort, root / "minilm-npu", "core-ultra-155h"),
            "rk": _labelled(ort, root / "minilm-rk", "rk3588-8g")}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    small = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False})
    npu_node = c.add_node(**small, resources={"intel_npu": 2})
    daemons = _ray_daemons()
    yield c, npu_node.node_id
    c.shutdown()
    assert daemons, "the cluster's raylet / gcs_server were not found among this test's processes"
    psutil.wait_procs([psutil.Process(p) for p in daemons if psutil.pid_exists(p)], timeout=30)
    left = [p for p in daemons if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"Ray daemons left after shutdown: {left}"


def _embed(url: str) -> np.ndarray:
    r = httpx.post(url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_embeddings_through_ray_equal_single_box(cluster, bundles, tmp_path):
    c, npu_node = cluster
    with ServerProc([bundles["npu"]], "--ray", c.address, "--replicas", "2", log=tmp_path / "ray.log") as fleet:
        placed = httpx.get(fleet.url + "/v1/models", timeout=30).json()["data"][0]["placement"]
        assert placed == {"node_id": npu_node, "resource": "intel_npu"}  # the node with the resource
        via_ray = _embed(fleet.url)
        bad = httpx.post(fleet.url + "/v1/embeddings", json={"input": []}, timeout=30)
        assert bad.status_code == 400 and "at least one string" in bad.json()["error"]["message"]
        with ServerProc([bundles["host"]], log=tmp_path / "box.log") as box:
            single = _embed(box.url)
        _kill_a_replica_under_load(fleet.url)
        rc = fleet.terminate()
    assert via_ray.shape == (3, 384)
    np.testing.assert_allclose(via_ray, single, rtol=0, atol=1e-6)
    assert rc == 128 + signal.SIGTERM, fleet.output()


def _replicas() -> set[int]:
    """The bundle's Serve replica processes (Ray names them ServeReplica:<app>:<deployment>)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "ServeReplica:edgeinfer:bundle-" in " ".join(p.cmdline())}


def _kill_a_replica_under_load(url: str, clients: int = 6, seconds: float = 6.0) -> None:
    """SIGKILL one of two replicas while clients send requests back to back: only requests in flight at the
    kill may fail (503, counted); the other replica keeps answering; Serve starts a new replica."""
    before = _replicas()
    assert len(before) == 2, before
    results: list[tuple[float, int]] = []
    stop = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < stop:
                r = http.post(url + "/v1/embeddings", json={"input": TEXTS[:1]})
                results.append((time.monotonic(), r.status_code))
                assert r.status_code == 200 or r.json()["error"]["code"] == 503, r.text

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    victim = sorted(before)[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join()
    failed = [s for _, s in results if s != 200]
    assert len(failed) <= clients, f"{len(failed)} failed: more than the {clients} requests that can be in flight"
    assert sum(1 for at, s in results if at > killed_at + 0.5 and s == 200) > 0, "no answer after the kill"
    deadline = time.monotonic() + 60
    while not (_replicas() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _replicas() - before, "Serve did not start a new replica within 60 s"
    print(f"replica kill: {len(results)} requests, {len(failed)} failed (in flight at the kill)")


def test_a_resource_no_node_has_is_refused_in_one_line(cluster, bundles):
    c, _ = cluster
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "serve", str(bundles["rk"]), "--ray", c.address],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'rk3588_npu'" in errors[0] and "has 0" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unreachable_head_is_one_line_exit_3_at_once(bundles):
    address = f"127.0.0.1:{free_port()}"  # bound and closed again: nothing listens there
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "serve", str(bundles["host"]), "--ray", address],
                          capture_output=True, text=True, timeout=60)  # ray.init alone would wait minutes
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"cannot reach the Ray head at {address}" in proc.stderr
