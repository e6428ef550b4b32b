"""`edgeinfer serve --ray` on a local Ray cluster on loopback: a head and one more node started here, the second
advertising a fake `intel_npu` resource (no Intel NPU on this machine). The bundle is the real MiniLM bundle,
its manifest labelled for a board whose replicas need that resource (core-ultra-155h → intel_npu) or one
that no node has (rk3588-8g → rk3588_npu). One replica of two is killed under load (SIGKILL)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import labelled_bundle, npu_test_board
from scoring_bundles import classifier_host_bundle, reranker_host_bundle  # noqa: F401 - fixtures

from edgeinfer.testing.serve import ServerProc, free_port, minilm_bundle

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'edgeinfer[fleet]'")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.slow
RAY_DAEMONS = ("raylet", "gcs_server")
TEXTS = ["a fleet of edge boards", "one endpoint for every board", "x"]
KEY = "fleet-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _ray_daemons() -> set[int]:
    """The Ray daemons this test process started (its descendants), by pid."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if any(d in " ".join(p.cmdline()) for d in RAY_DAEMONS)}


@pytest.fixture(scope="module")
def bundles(minilm_onnx, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-bundles")
    ort = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    return {"host": ort, "npu": labelled_bundle(ort, root / "minilm-npu", "core-ultra-155h"),
            "rk": labelled_bundle(ort, root / "minilm-rk", "rk3588-8g")}


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


def _embed(url: str, headers: dict | None = None) -> np.ndarray:
    r = httpx.post(url + "/v1/embeddings", json={"input": TEXTS}, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_embeddings_through_ray_equal_single_box(cluster, bundles, tmp_path):
    c, npu_node = cluster
    (tmp_path / "key").write_text(KEY + "\n")
    with ServerProc([bundles["npu"]], "--ray", c.address, "--replicas", "2", "--api-key-file", str(tmp_path / "key"),
                    log=tmp_path / "ray.log", wait_ready=False) as fleet:
        fleet.wait_ready(headers=AUTH)
        _key_is_checked_as_on_one_box(fleet.url)
        placed = httpx.get(fleet.url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["placement"]
        assert placed == {"node_id": npu_node, "resource": "intel_npu",  # the node with the resource
                          "bundle": str(bundles["npu"].resolve())}  # by path (shared storage)
        via_ray = _embed(fleet.url, AUTH)
        bad = httpx.post(fleet.url + "/v1/embeddings", json={"input": []}, headers=AUTH, timeout=30)
        assert bad.status_code == 400 and "at least one string" in bad.json()["error"]["message"]
        with ServerProc([bundles["host"]], log=tmp_path / "box.log") as box:
            single = _embed(box.url)
        _kill_a_replica_under_load(fleet.url)
        rc = fleet.terminate()
    assert via_ray.shape == (3, 384)
    np.testing.assert_allclose(via_ray, single, rtol=0, atol=1e-6)
    assert rc == 128 + signal.SIGTERM, fleet.output()


def _key_is_checked_as_on_one_box(url: str) -> None:
    """--api-key-file on the router: the single-box server's rule (tests/test_serve_lifecycle.py): every path but
    /health answers 401 without the right Bearer key, /metrics too."""
    for method, path in [("GET", "/v1/models"), ("GET", "/ready"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                         ("GET", "/docs"), ("POST", "/v1/embeddings"), ("POST", "/v1/chat/completions")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": KEY}):
            r = httpx.request(method, url + path, headers=headers, json={"input": TEXTS}, timeout=30)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, r.text)
            assert r.json()["error"] == {"message": "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                         "type": "authentication_error", "code": 401}
    assert httpx.get(url + "/metrics", headers=AUTH, timeout=30).status_code == 200
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}


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
                r = http.post(url + "/v1/embeddings", json={"input": TEXTS[:1]}, headers=AUTH)
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


# --- decoders through Ray, planner-checked placement, autoscaling, /metrics --------------------------------

PROMPTS = ["Once upon a time", "The history of the city"]
SLOTS = 2


def _per_replica_gib(bundle, board: str) -> tuple[float, float]:
    """One replica's memory (weights + kv + activations + runtime) and the board's reserve, from `plan --json`."""
    import json

    from helpers import edgeinfer

    proc = edgeinfer("plan", str(bundle / "tokenizer" / "config.json"), "--board", board, "--quant", "fp32",
                     "--ctx", "256", "--batch", str(SLOTS), "--json")
    bd = json.loads(proc.stdout)["memory"]["breakdown"]
    return sum(bd[k] for k in ("weights", "kv_cache", "activations", "runtime")) / 2**30, bd["reserved"] / 2**30


@pytest.fixture(scope="module")
def decoders(tiny_qwen3_host_bundle, tmp_path_factory):
    """Copies of the session's tiny-qwen3 bundle labelled for test boards: one that holds many replicas, one
    that holds exactly one (replicas > 1 refused by the plan), one that holds none."""
    root = tmp_path_factory.mktemp("fleet-decoders")
    roomy = npu_test_board(root / "npu-roomy.yaml")
    per, reserve = _per_replica_gib(tiny_qwen3_host_bundle, roomy)
    assert 0 < per < 2 and reserve > 0
    return {"roomy": labelled_bundle(tiny_qwen3_host_bundle, root / "tiny-qwen3-npu", roomy),
            "one": labelled_bundle(tiny_qwen3_host_bundle, root / "tiny-qwen3-one",
                             npu_test_board(root / "npu-one.yaml", memory_total_gib=reserve + 1.5 * per)),
            "none": labelled_bundle(tiny_qwen3_host_bundle, root / "tiny-qwen3-none",
                              npu_test_board(root / "npu-none.yaml", memory_total_gib=reserve + 0.5 * per))}


def _stream(url: str, model: str, prompt: str) -> tuple[str, int]:
    """A greedy streamed chat answer read as server-sent events: (text, completion tokens from the usage chunk)."""
    import json

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.read()
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    return text, chunks[-1]["usage"]["completion_tokens"]


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


def _autoscaling(address: str, deployment: str) -> dict:
    """The deployment's autoscaling config as Serve's controller holds it (what Serve's REST API
    /api/serve/applications/ returns), read from this process joined to the cluster as a driver."""
    from ray import serve

    ray.init(address=address, log_to_driver=False)
    try:
        details = serve.context._get_global_client().get_serve_details()
    finally:
        ray.shutdown()
    return details["applications"]["edgeinfer"]["deployments"][deployment]["deployment_config"]["autoscaling_config"]


def _decoder_workers() -> set[int]:
    """Decoder worker processes (multiprocessing spawn children) among this test's descendants."""
    return {p.pid for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())}


RERANK = {"model": "reranker", "query": "a fleet of edge boards", "top_n": 2, "return_documents": True,
          "documents": ["one endpoint for every board", "boards at the edge of the network", "x"]}
CLASSIFY = {"model": "classifier", "input": TEXTS}


def _scored(url: str) -> list[dict]:
    """A rerank (on both paths) and a classify answer, without the per-request id and time."""
    out = []
    for path, body in [("/v1/rerank", RERANK), ("/v2/rerank", RERANK), ("/v1/classify", CLASSIFY)]:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, (path, r.text)
        out.append({k: v for k, v in r.json().items() if k not in ("id", "created")})
    return out


def test_streamed_chat_through_ray_equals_single_box_with_autoscaling_and_metrics(
        cluster, decoders, tiny_qwen3_host_bundle, reranker_host_bundle, classifier_host_bundle,  # noqa: F811
        tmp_path):
    """Also a reranker's and a classifier's answers through the router (CPU bundles, replicas anywhere)."""
    from prometheus_client.parser import text_string_to_metric_families

    c, npu_node = cluster
    scorers = [reranker_host_bundle, classifier_host_bundle]
    with ServerProc([decoders["roomy"], *scorers], "--ray", c.address, "--replicas", "auto", "--slots", str(SLOTS),
                    "--ship-bundles", log=tmp_path / "ray.log") as fleet:
        models = {m["id"]: m for m in httpx.get(fleet.url + "/v1/models", timeout=30).json()["data"]}
        model = models["tiny-qwen3-npu"]
        scored_via_ray = _scored(fleet.url)
        wrong = httpx.post(fleet.url + "/v1/rerank", json={**RERANK, "model": "classifier"}, timeout=30)
        assert model["id"] == "tiny-qwen3-npu"
        placed = model["placement"]
        assert placed["node_id"] == npu_node and placed["resource"] == "intel_npu"
        shipped = Path(placed["bundle"])  # through the object store, unpacked on the node, not the path given
        assert shipped.parent.parent == Path(tempfile.gettempdir()) / "edgeinfer-fleet", shipped
        assert shipped.name == "tiny-qwen3-npu" and shipped != decoders["roomy"].resolve()
        via_ray = [_stream(fleet.url, "tiny-qwen3-npu", p) for p in PROMPTS]
        scaling = _autoscaling(c.address, "bundle-tiny-qwen3-npu")
        deadline, text = time.monotonic() + 30, ""
        while time.monotonic() < deadline:  # replicas push their registries every 2 s
            text = httpx.get(fleet.url + "/metrics", timeout=30).text
            if _metric(text, "edgeinfer_generation_tokens_total", model="tiny-qwen3-npu"):
                break
            time.sleep(0.5)
        workers = _decoder_workers()
        rc = fleet.terminate()
    with ServerProc([tiny_qwen3_host_bundle, *scorers], "--slots", str(SLOTS), log=tmp_path / "box.log") as box:
        single = [_stream(box.url, "tiny-qwen3-host", p) for p in PROMPTS]
        scored_single = _scored(box.url)
    assert via_ray == single and all(tokens > 0 for _, tokens in single), (via_ray, single)
    assert scored_via_ray == scored_single, (scored_via_ray, scored_single)
    results = scored_single[0]["results"]  # top_n 2 of 3, best first, each with its document
    assert len(results) == 2 and results[0]["relevance_score"] >= results[1]["relevance_score"], results
    assert all(r["document"]["text"] == RERANK["documents"][r["index"]] for r in results), results
    assert len(scored_single[2]["data"]) == len(TEXTS)
    assert wrong.status_code == 404 and "reranker" in wrong.json()["error"]["message"], wrong.text
    # auto: from 1 up to what the node holds: its 2 intel_npu units hold many fractional replicas (the plan's
    # share), its one CPU two replicas of 0.5 CPU; a decoder replica's target is its KV slots
    assert scaling["min_replicas"] == 1 and scaling["max_replicas"] == 2, scaling
    assert scaling["target_ongoing_requests"] == SLOTS, scaling
    assert _metric(text, "edgeinfer_requests_total", endpoint="/v1/chat/completions", replica="router",
                   status="200") == len(PROMPTS)
    assert _metric(text, "edgeinfer_generation_tokens_total", model="tiny-qwen3-npu") == sum(t for _, t in via_ray)
    assert "bundle-tiny-qwen3-npu#" in text
    # the replica's device gauges (edgeinfer/serve/device_gauges.py), labelled by its node and replica
    rss = {s.labels["process"]: s.labels["replica"] for f in text_string_to_metric_families(text) for s in f.samples
           if s.name == "edgeinfer_process_rss_bytes" and s.labels["node"] == npu_node and s.value > 0}
    assert rss.keys() == {"server", "decoder"}, rss
    assert all(r.startswith("bundle-tiny-qwen3-npu#") for r in rss.values()), rss
    assert rc == 128 + signal.SIGTERM, fleet.output()
    assert len(workers) >= 1, "the decoder replica's worker process was not found"
    psutil.wait_procs([psutil.Process(p) for p in workers if psutil.pid_exists(p)], timeout=30)
    assert not [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert {f.name for f in shipped.rglob("*")} >= {"manifest.json", "model.onnx"}
    for m in models.values():
        shutil.rmtree(Path(m["placement"]["bundle"]).parent, ignore_errors=True)


def _refused(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "edgeinfer.cli", "serve", *args], capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error:")]) == 1, proc.stderr
    return proc


def test_a_decoder_the_plan_says_does_not_fit_is_refused_exit_1(decoders):
    address = f"127.0.0.1:{free_port()}"  # refused before joining: nothing needs to listen there
    proc = _refused(str(decoders["none"]), "--ray", address, "--slots", str(SLOTS))
    assert proc.returncode == 1, proc.stderr
    assert "tiny-qwen3-none does not fit its board npu-none: one replica needs" in proc.stderr


def test_more_replicas_than_the_plan_lets_a_node_hold_are_refused_exit_1(cluster, decoders):
    c, _ = cluster  # the node has 2 intel_npu units, but the board's memory holds one replica
    one = _refused(str(decoders["one"]), "--ray", c.address, "--slots", str(SLOTS), "--replicas", "2")
    assert one.returncode == 1, one.stderr
    assert "2 replica(s) asked, the cluster's nodes with 'intel_npu' hold 1: the plan fits 1 replica(s) per " \
           "npu-one node" in one.stderr
