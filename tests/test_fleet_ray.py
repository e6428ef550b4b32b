"""`edgeinfer serve --ray` on a local Ray cluster on loopback: a head and one more node started here, the second
advertising a fake `intel_npu` resource (no Intel NPU on this machine). The bundle is the real MiniLM bundle,
its manifest labelled for a board whose replicas need that resource (core-ultra-155h → intel_npu) or one
that no node has (rk3588-8g → rk3588_npu). One replica of two is killed under load (SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import labelled_bundle, npu_test_board
from scoring_bundles import classifier_host_bundle, reranker_host_bundle  # noqa: F401 - fixtures

from edgeinfer.testing.serve import ServerProc, free_port, minilm_bundle

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'edgeinfer[fleet]'")
httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # Ray clusters: in the serial pass (conftest.py)
RAY_DAEMONS = ("raylet", "gcs_server")
TEXTS = ["a fleet of edge boards", "one endpoint for every board", "x"]
KEY = "fleet-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _ray_daemons() -> set[int]:
    """The Ray daemons this test process started (its descendants), by pid."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if any(d in " ".join(p.cmdline()) for d in RAY_DAEMONS)}


@pytest.fixture(scope="module")
def bundles(minilm_onnx, module_tmp):
    root = module_tmp
    ort = minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime")
    return {"host": ort, "npu": labelled_bundle(ort, root / "minilm-npu", "core-ultra-155h"),
            "rk": labelled_bundle(ort, root / "minilm-rk", "rk3588-8g")}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    small = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    # Both nodes are on 127.0.0.1: Serve's proxy on the second node would share the head proxy's port through
    # SO_REUSEPORT and answer 404 until its route table arrives. Only a worker node's proxy reads this port
    # (Ray's per-node override), so the servers' URLs reach the head's proxy alone, as on separate machines.
    os.environ["RAY_SERVE_WORKER_PROXY_HTTP_PORT"] = str(free_port())
    try:
        c = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False})
        npu_node = c.add_node(**small, resources={"intel_npu": 2})
    finally:
        del os.environ["RAY_SERVE_WORKER_PROXY_HTTP_PORT"]
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
    """SIGKILL one of two replicas while clients send requests back to back: the requests in flight at the
    kill are sent again by the router, to the other replica, so none fails; Serve starts a new replica."""
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
    print(f"\nembedding replica kill: {len(results)} requests sent, {len(results) - len(failed)} answered, "
          f"{len(failed)} failed {failed}")
    assert not failed, f"{len(failed)} failed: the router did not send them again"
    assert sum(1 for at, s in results if at > killed_at + 0.5 and s == 200) > 0, "no answer after the kill"
    deadline = time.monotonic() + 60
    while not (_replicas() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _replicas() - before, "Serve did not start a new replica within 60 s"


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


def _chat(model: str, prompt: str, max_tokens: int = 16) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}


def _stream(url: str, model: str, prompt: str, max_tokens: int = 16) -> tuple[str, int]:
    """A greedy streamed chat answer read as server-sent events: (text, completion tokens from the usage chunk)."""
    import json

    body = _chat(model, prompt, max_tokens)
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
    """Decoder worker processes (edgeinfer.serve.child children) among this test's descendants."""
    return {p.pid for p in psutil.Process().children(recursive=True) if "child_main" in " ".join(p.cmdline())}


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


LONG = 200  # tokens of the streams a replica is killed under (the bundle's ctx is 256)


@pytest.fixture(scope="module")
def single_box(tiny_qwen3_host_bundle, reranker_host_bundle, classifier_host_bundle,  # noqa: F811
               tmp_path_factory):
    """The single-box server's answers the fleet's must equal: greedy streams of PROMPTS (16 and LONG tokens),
    and the scorers' answers."""
    log = tmp_path_factory.mktemp("single-box") / "box.log"
    with ServerProc([tiny_qwen3_host_bundle, reranker_host_bundle, classifier_host_bundle], "--slots", str(SLOTS),
                    log=log) as box:
        return {"streams": [_stream(box.url, "tiny-qwen3-host", p) for p in PROMPTS],
                "long": {p: _stream(box.url, "tiny-qwen3-host", p, LONG)[0] for p in PROMPTS},
                "scored": _scored(box.url)}


def test_streamed_chat_through_ray_equals_single_box_with_autoscaling_and_metrics(
        cluster, decoders, single_box, reranker_host_bundle, classifier_host_bundle, tmp_path):  # noqa: F811
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
        generated = sum(t for _, t in via_ray)
        while time.monotonic() < deadline:  # replicas push their registries every 2 s: a push from before the
            text = httpx.get(fleet.url + "/metrics", timeout=30).text  # last stream ended counts fewer tokens
            if _metric(text, "edgeinfer_generation_tokens_total", model="tiny-qwen3-npu") == generated:
                break
            time.sleep(0.5)
        workers = _decoder_workers()
        rc = fleet.terminate()
    single, scored_single = single_box["streams"], single_box["scored"]
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
    assert _metric(text, "edgeinfer_generation_tokens_total", model="tiny-qwen3-npu") == generated
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


# --- failures a fleet must survive, and the autoscaling round trip (issue 32 §2) ----------------------------
# Each prints its figures (pytest -s): requests sent, answered, failed (with the status seen), recovery time.

DECODER_REPLICA = "ServeReplica:edgeinfer:bundle-tiny-qwen3-npu"
ROUTER_REPLICA = "ServeReplica:edgeinfer:router"
MODEL = "tiny-qwen3-npu"


def _procs(marker: str) -> set[int]:
    """This test's descendant processes whose command line holds ``marker`` (Ray titles a Serve replica
    ServeReplica:<app>:<deployment>)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if marker in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _until(check, timeout_s: float, what: str, every_s: float = 0.1) -> float:
    """Seconds until ``check()`` holds, polled; fails naming ``what`` after ``timeout_s``."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(every_s)
    return time.monotonic() - t0


def _read(url: str, body: dict, started: list | None = None) -> dict:
    """One streamed chat read to its end: status, its ``data:`` events, its text, its error event, when it
    ended; ``started`` gets an entry when the first content arrives."""
    import json

    events, status, t0 = [], None, time.monotonic()
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if started is not None and len(events) == 2:  # the role chunk, then the first content
                        started.append(time.monotonic())
    except httpx.HTTPError as e:
        status = type(e).__name__
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return {"status": status, "start": t0, "end": time.monotonic(), "done": bool(events) and events[-1] == "[DONE]",
            "prompt": body["messages"][0]["content"],
            "error": next((ch["error"] for ch in chunks if "error" in ch), None),
            "text": "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices"))}


LOAD = 3 * SLOTS  # streaming clients: 3 per replica's target (its slots) asks for 3 replicas, capped at 2


@pytest.fixture(scope="module")
def decoder_fleet(cluster, decoders, tmp_path_factory):
    """The decoder autoscaling between 1 and 2 replicas behind the router, the autoscaler's delays shortened
    (EDGEINFER_RAY_AUTOSCALING), for the failure tests (after every other fleet test: one Serve application
    per cluster)."""
    import json

    from edgeinfer.fleet.router import AUTOSCALING_ENV

    c, _ = cluster
    timing = {"upscale_delay_s": 0.5, "downscale_delay_s": 1, "look_back_period_s": 1, "metrics_interval_s": 0.25}
    log = tmp_path_factory.mktemp("decoder-fleet") / "ray.log"
    with ServerProc([decoders["roomy"]], "--ray", c.address, "--replicas", "1", "--max-replicas", "2",
                    "--slots", str(SLOTS), log=log, env={AUTOSCALING_ENV: json.dumps(timing)}) as fleet:
        yield fleet


def _reporting(url: str) -> set[str]:
    """Decoder replicas that have pushed their metrics to the router (loaded and serving; one gone stays listed
    for 30 s)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return set(re.findall(r'replica="(bundle-tiny-qwen3-npu#[^"]+)"', text))


@contextlib.contextmanager
def _streaming_load(url: str) -> Iterator[tuple[list[dict], list[int]]]:
    """LOAD clients streaming greedy LONG chats back to back until the block ends: (their results, the decoder
    replica count after each)."""
    results, counts, stop = [], [], threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            results.append(_read(url, _chat(MODEL, PROMPTS[i % 2], LONG)))
            counts.append(len(_procs(DECODER_REPLICA)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(LOAD)]
    for t in threads:
        t.start()
    try:
        yield results, counts
    finally:
        stop.set()
        for t in threads:
            t.join()


def _scaled_up(url: str) -> float:
    """From the fleet's floor of one replica (whichever test ran before), under load: the seconds until Serve
    runs 2 and the second one serves."""
    before = _reporting(url)
    up_s = _until(lambda: len(_procs(DECODER_REPLICA)) == 2, 60, "Serve scaled up to 2 replicas")
    _until(lambda: _reporting(url) - before, 60, "the second replica serving", 0.5)
    return up_s


def _at_floor() -> int:
    """The one decoder replica the fleet holds without load (the previous test's second one scaled down)."""
    _until(lambda: len(_procs(DECODER_REPLICA)) == 1, 60, "the fleet back at 1 replica")
    [only] = _procs(DECODER_REPLICA)
    return only


def _generating(replica: int, window_s: float = 0.5) -> bool:
    """Whether the replica's decoder worker ran during a short window (sequences in its slots): an idle worker
    blocks on its pipe and uses no CPU; a generating one gets a share of a core even on a machine loaded by
    the other tests (a tenth of the window is the bar)."""
    [worker] = [p for p in psutil.Process(replica).children() if "child_main" in " ".join(p.cmdline())]
    before = sum(worker.cpu_times()[:2])
    time.sleep(window_s)
    return sum(worker.cpu_times()[:2]) - before > window_s / 10


def test_autoscaling_round_trip_under_streaming_load(decoder_fleet, single_box):
    """LOAD clients streaming greedy chats back to back drive Serve from 1 replica to 2 (never more), every
    answer, from either replica, equals the single box's; once the load stops Serve scales down to 1."""
    url = decoder_fleet.url
    _at_floor()
    with _streaming_load(url) as (results, counts):
        up_s = _scaled_up(url)
        time.sleep(1.0)  # streams on the second replica too
    down_s = _until(lambda: len(_procs(DECODER_REPLICA)) == 1, 60, "Serve scaled down to 1 replica")
    print(f"\nautoscaling 1 -> 2 -> 1: up {up_s:.1f} s after the load began, down {down_s:.1f} s after it stopped; "
          f"{len(results)} streams")
    assert results and all(r["status"] == 200 and r["done"] and not r["error"] for r in results), results
    assert all(r["text"] == single_box["long"][r["prompt"]] for r in results), results
    assert max(counts) == 2 and down_s < 60, counts


def test_a_decoder_replica_killed_mid_stream(decoder_fleet, single_box):
    """Under LOAD streaming clients at 2 replicas, the first replica, generating, is SIGKILLed (then the other old
    one, up to 3 kills, while no stream has met a kill yet): the streams it was generating end with an error
    event and [DONE] within seconds (not a hang), the ones queued on it and every later one are answered by the
    other (the router sends a request again while nothing reached its client), every answer equals the single
    box's, Serve brings the count back to 2, and the killed replicas' decoder workers do not outlive them."""
    url, victim = decoder_fleet.url, _at_floor()
    kills: list[float] = []
    workers: list = []  # the killed replicas' decoder engine workers
    with _streaming_load(url) as (results, counts):
        _scaled_up(url)
        for _ in range(3):  # a kill that meets only streams yet to send a token fails none (the router sends
            # them again: a CI run saw 316 streams all answered): kill the other old replica, up to 3 times
            others = _procs(DECODER_REPLICA) - {victim}
            workers += psutil.Process(victim).children(recursive=True)
            _until(lambda: _generating(victim), 60, "the replica generating")
            os.kill(victim, signal.SIGKILL)
            kills.append(time.monotonic())
            back_s = _until(lambda: len(_procs(DECODER_REPLICA) - {victim}) == 2, 60, "Serve replaced the replica")
            time.sleep(2.0)  # the streams in flight at the kill have ended
            if any(r["error"] for r in results):
                break
            victim = min(others)
    gone = psutil.wait_procs(workers, timeout=30)[1]
    failed = [r for r in results if r["error"]]
    killed = kills[-1]  # the loop stops at the first kill that failed a stream
    ended = max((r["end"] - killed for r in failed), default=0.0)
    print(f"\ndecoder replica kill at 2 replicas ({len(kills)} kill(s)): {len(results)} streams sent, "
          f"{len(results) - len(failed)} answered, {len(failed)} ended with an error event "
          f"{[r['error']['code'] for r in failed]} at most {ended:.1f} s after the kill; replaced in {back_s:.1f} s")
    assert all(r["status"] == 200 and r["done"] for r in results), results
    # those it was generating (its slots) and those whose last chunks were still on their way to the router
    # (a sequence that finished frees its slot for the next before the router has relayed its end); the ones
    # queued on it went elsewhere
    assert 1 <= len(failed) <= 2 * SLOTS and all(r["start"] < killed < r["end"] for r in failed), failed
    assert all(r["error"]["code"] == 503 and single_box["long"][r["prompt"]].startswith(r["text"])
               for r in failed), failed
    assert ended < 30, ended
    answered = [r for r in results if not r["error"]]
    assert all(r["text"] == single_box["long"][r["prompt"]] for r in answered), answered
    assert not gone, f"the killed replica's decoder worker outlived it: {gone}"


def test_the_router_killed(decoder_fleet):
    """SIGKILL of the router's replica (the HTTP ingress) under two clients: requests fail cleanly (an HTTP
    status with an error body, or a refused connection, no hang) until Serve has a new router; then the fleet
    answers again without anyone acting."""
    url, [router] = decoder_fleet.url, _procs(ROUTER_REPLICA)
    results: list[tuple[float, object]] = []
    stop, bodies = threading.Event(), set()

    def client(i: int) -> None:
        body = {**_chat(MODEL, PROMPTS[i % 2], 8), "stream": False}
        body.pop("stream_options")
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    r = http.post(url + "/v1/chat/completions", json=body)
                    status = r.status_code
                    if status != 200:
                        bodies.add(r.text[:120])
                except httpx.TransportError as e:
                    status = type(e).__name__
                    time.sleep(0.1)
                results.append((sent, status))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        os.kill(router, signal.SIGKILL)
        killed = time.monotonic()
        recovery_s = _until(lambda: any(at > killed and s == 200 for at, s in results), 60,
                            "the fleet answered after the router's kill")
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
    failed = [s for _, s in results if s != 200]
    print(f"\nrouter kill: {len(results)} requests sent, {len(results) - len(failed)} answered, {len(failed)} failed "
          f"{sorted(set(map(str, failed)))} {sorted(bodies)}; answering again {recovery_s:.1f} s after the kill")
    assert _procs(ROUTER_REPLICA) - {router}, "Serve did not start a new router"
    assert all(s in (500, 502, 503) or isinstance(s, str) for s in failed), failed
    assert all(s == 200 for at, s in results if at > killed + recovery_s), results
