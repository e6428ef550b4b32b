"""``edgeinfer serve`` under stress, each case on its own real server: SIGTERM under load, a crashed worker,
a full queue, timeouts and the API key."""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import threading
import time

import httpx
import pytest

from edgeinfer.serve.supervisor import STOP_GRACE_S
from edgeinfer.testing import minilm
from edgeinfer.testing.llm import model_dir
from edgeinfer.testing.serve import ServerProc, minilm_bundle, slow_bundle

pytestmark = pytest.mark.slow

T = httpx.Timeout(60.0)


@pytest.fixture(scope="module")
def ort_bundle(minilm_onnx, tmp_path_factory):
    return minilm_bundle(minilm_onnx, tmp_path_factory.getbasetemp() / "serve-bundles" / "minilm-ort", "onnxruntime")


def embed_body(i: int) -> dict:
    s = minilm.sentences()
    return {"input": [s[i % len(s)], s[(i * 7) % len(s)]]}


def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(ort_bundle, tmp_path):
    server = ServerProc([ort_bundle], "--log-level", "debug", "--batch-window-ms", "5", log=tmp_path / "log")
    outcomes: dict[str, tuple[str, float]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    sigterm_at: list[float] = []

    def client(t: int) -> None:
        with httpx.Client(timeout=T) as c:
            for n in range(300):  # bounded in count ...
                if stop.is_set():
                    return
                rid = f"c{t}-{n}"
                try:
                    r = c.post(server.url + "/v1/embeddings", json=embed_body(n + 31 * t),
                               headers={"X-Request-Id": rid})
                    ok = r.status_code == 200 and len(r.json()["data"]) == 2 and r.headers["x-request-id"] == rid
                    result = "ok" if ok else f"http {r.status_code}"
                except httpx.TransportError as e:  # refused / closed: the server no longer accepts
                    result = f"transport {type(e).__name__}"
                with lock:
                    outcomes[rid] = (result, time.monotonic())
                if result.startswith("transport"):
                    return

    threads = [threading.Thread(target=client, args=(t,)) for t in range(12)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 60  # ... and in time
    while time.monotonic() < deadline and sum(o[0] == "ok" for o in list(outcomes.values())) < 40:
        time.sleep(0.05)
    sigterm_at.append(time.monotonic())
    server.proc.send_signal(signal.SIGTERM)
    for th in threads:
        th.join(90)
    stop.set()
    rc = server.terminate()
    log = server.output()
    assert rc == 0, log[-3000:]
    accepted = set(re.findall(r"accepted POST /v1/embeddings id=(\S+)", log))
    answered = set(re.findall(r"answered /v1/embeddings id=(\S+) status=200", log))
    assert accepted, log[-2000:]
    assert accepted == answered  # the server answered every request it accepted
    for rid in accepted:  # ... and every one of those answers reached its client intact
        assert outcomes.get(rid, ("missing",))[0] == "ok", (rid, outcomes.get(rid))
    bad = {rid: o for rid, o in outcomes.items() if o[0] != "ok" and not o[0].startswith("transport")}
    assert not bad  # no 5xx, no 503 while draining
    assert all(rid not in accepted for rid, o in outcomes.items() if o[0].startswith("transport"))
    late = [rid for rid, o in outcomes.items() if o[0] == "ok" and o[1] > sigterm_at[0]]
    assert late, "no request was in flight when SIGTERM arrived"
    assert "Traceback" not in log


def test_killed_worker_is_restarted_and_its_requests_retried(ort_bundle, tmp_path):
    with ServerProc([ort_bundle], "--devices", "0,1", "--max-batch", "4", log=tmp_path / "log") as server:
        workers = httpx.get(server.url + "/ready").json()["workers"]
        victim = workers[0]["pid"]

        def call(i):
            return httpx.post(server.url + "/v1/embeddings", json=embed_body(i), timeout=T)

        with cf.ThreadPoolExecutor(8) as ex:
            futs = [ex.submit(call, i) for i in range(80)]
            time.sleep(0.3)
            os.kill(victim, signal.SIGKILL)
            results = [f.result() for f in futs]
        assert [r.status_code for r in results] == [200] * 80, [r.text for r in results if r.status_code != 200][:3]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            w0 = httpx.get(server.url + "/ready").json()["workers"][0]
            if w0["state"] == "idle" and w0["pid"] != victim:
                break
            time.sleep(0.2)
        assert w0["restarts"] == 1 and w0["pid"] != victim, w0
        text = httpx.get(server.url + "/metrics").text
        assert re.search(r'edgeinfer_worker_restarts_total\{worker="0"\} 1\.0', text)
        assert httpx.post(server.url + "/v1/embeddings", json=embed_body(1), timeout=T).status_code == 200


def test_full_queue_answers_429_with_retry_after_and_keeps_serving(ort_bundle, tmp_path):
    with ServerProc([ort_bundle], "--max-queue", "2", "--max-batch", "1", "--batch-window-ms", "0",
                    log=tmp_path / "log") as server:
        start = threading.Barrier(48)

        def call(i):
            start.wait()
            return httpx.post(server.url + "/v1/embeddings", json=embed_body(i), timeout=T)

        with cf.ThreadPoolExecutor(48) as ex:
            results = list(ex.map(call, range(48)))
        codes = [r.status_code for r in results]
        assert set(codes) <= {200, 429}, codes
        assert codes.count(429) >= 1 and codes.count(200) >= 1, codes
        for r in results:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == 429
        assert httpx.get(server.url + "/ready").status_code == 200
        assert httpx.post(server.url + "/v1/embeddings", json=embed_body(0), timeout=T).status_code == 200
        assert server.proc.poll() is None


def test_api_key_and_timeouts(ort_bundle, tmp_path):
    """Every endpoint but /health needs the key; a request still waiting past --timeout-s gets 504."""
    key = "s3cret-key"
    server = ServerProc([ort_bundle], "--timeout-s", "0.001", log=tmp_path / "log",
                        env={"EDGEINFER_API_KEY": key}, wait_ready=False)
    try:
        good = {"Authorization": f"Bearer {key}"}
        server.wait_ready(headers=good)
        assert httpx.get(server.url + "/health").status_code == 200
        for method, path in [("GET", "/v1/models"), ("GET", "/ready"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                             ("GET", "/docs"), ("POST", "/v1/embeddings"), ("POST", "/v1/infer")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {key}"},
                            {"Authorization": key}):
                r = httpx.request(method, server.url + path, headers=headers, json={"input": "x"})
                assert r.status_code == 401, (method, path, headers, r.status_code)
                assert r.json()["error"]["code"] == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(server.url + "/v1/models", headers=good).status_code == 200
        assert httpx.get(server.url + "/metrics", headers=good).status_code == 200
        r = httpx.post(server.url + "/v1/embeddings", headers=good, json={"input": "x"}, timeout=T)
        assert r.status_code == 504 and "--timeout-s" in r.json()["error"]["message"]
        # a batch still running --timeout-s after its cancel gets its worker restarted: ready again soon after
        deadline = time.monotonic() + 60
        while httpx.get(server.url + "/ready", headers=good).status_code != 200:
            assert time.monotonic() < deadline, "the server did not become ready again after the timeout"
            time.sleep(0.2)
    finally:
        assert server.terminate() == 0


def wait_until(cond, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout} s")


def sigterm_and_time(server: ServerProc) -> tuple[int, float]:
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rc = server.terminate(timeout=120)
    return rc, time.monotonic() - start


def test_while_starting_ready_models_are_served_and_sigterm_kills_a_loading_worker(tmp_path):
    """A decoder that is ready answers while an embedding worker still loads (a fixed batch of 8192 rows
    through 64 dense layers: minutes of warm-up); that model's requests get 503 'starting: 1 of 2 models
    ready' with Retry-After, never a 504 after --timeout-s. SIGTERM then ends the server within the stop
    grace period: the loading worker (which reads no messages and ignores SIGTERM) is killed."""
    slow = slow_bundle(tmp_path / "slow-to-load", batch=8192)
    server = ServerProc([slow, model_dir()], "--threads", "1", log=tmp_path / "log", wait_ready=False)
    try:
        def decoder_ready():
            r = httpx.get(server.url + "/ready", timeout=10)
            return r.json()["decoders"][0]["state"] == "ready" and r.json()["workers"][0]["state"] == "starting"

        wait_until(lambda: server.proc.poll() is None and _answers(server) and decoder_ready(), what="decoder ready")
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny-qwen3", "prompt": "Once upon a time",
                                                             "max_tokens": 4, "temperature": 0}, timeout=T)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text[:300]
        r = httpx.post(server.url + "/v1/infer", json={"model": "slow-to-load", "inputs": {"x": [[0.0] * 16]}},
                       timeout=T)
        assert r.status_code == 503, r.text[:300]
        assert r.json()["error"]["message"] == "starting: 1 of 2 models ready; retry in a moment"
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(server.url + "/ready").json()["workers"][0]["state"] == "starting"  # still loading
    finally:
        rc, took = sigterm_and_time(server)
    assert rc == 0 and took < STOP_GRACE_S, (rc, took, server.output()[-2000:])


def _answers(server: ServerProc) -> bool:
    try:
        return httpx.get(server.url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_sigterm_while_a_decoder_worker_is_restarting_ends_the_server_within_the_grace_period(tmp_path):
    """SIGTERM while the decoder worker is being loaded again (after it died) stops the loading worker at
    once, not after it has loaded."""
    with ServerProc([model_dir()], "--threads", "1", log=tmp_path / "log") as server:
        pid = httpx.get(server.url + "/ready").json()["decoders"][0]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: httpx.get(server.url + "/ready").json()["decoders"][0]["state"] == "restarting",
                   what="decoder restarting")
        rc, took = sigterm_and_time(server)
    assert rc == 0 and took < STOP_GRACE_S, (rc, took, server.output()[-2000:])
    assert "Traceback" not in server.output()
