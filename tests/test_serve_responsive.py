"""``edgeinfer serve`` stays responsive and honest, on real servers: ``/health`` while the largest allowed
request is worked on, timed-out work that does not hold up later requests, malformed HTTP, outputs that
are not numbers, token ids outside the vocabulary, request limits and the API key file."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time

import httpx
import numpy as np
import pytest

from edgeinfer.testing import minilm
from edgeinfer.testing.serve import (
    HealthProbe,
    ServerProc,
    largest_embeddings_body,
    largest_generation_bodies,
    log_bundle,
    minilm_bundle,
    slow_bundle,
)

pytestmark = pytest.mark.slow

T = httpx.Timeout(120.0)
KEY = "file-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def ort_bundle(minilm_onnx, tmp_path_factory):
    return minilm_bundle(minilm_onnx, tmp_path_factory.getbasetemp() / "serve-bundles" / "minilm-ort", "onnxruntime")


@pytest.fixture(scope="module")
def server(ort_bundle, tmp_path_factory):
    """MiniLM and a log(x) model behind a key read from a file."""
    d = tmp_path_factory.mktemp("serve-resp")
    (d / "key").write_text(KEY + "\n")
    server = ServerProc([ort_bundle, log_bundle(d / "log")], "--api-key-file", str(d / "key"), log=d / "log.txt",
                        wait_ready=False)
    try:
        server.wait_ready(headers=AUTH)
        yield server
    finally:
        assert server.terminate() == 0


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory):
    """A server nobody sends work to: its /health latency over the same seconds is the machine's own noise.
    One for the module; the responsiveness tests only read its /health."""
    d = tmp_path_factory.mktemp("serve-idle")
    with ServerProc([log_bundle(d / "log-model")], log=d / "idle.log") as idle:
        yield idle


def strict_json(text: str):
    """Parse as the JSON standard says: NaN and Infinity are not JSON."""
    def refuse(name):
        raise AssertionError(f"the server sent {name}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- responsiveness -----------------------------------------------------------------------------------


def _within_bound(probe: HealthProbe, control: HealthProbe, start: float, end: float, what: str,
                  reports: list[str]) -> bool:
    """Whether /health's p99 between ``start`` and ``end`` stayed under 50 ms beyond the idle server's p99
    over the same seconds (the machine's own noise); the figures go to ``reports`` and stdout."""
    during, noise = np.array(probe.between(start, end)), np.array(control.between(start, end))
    assert len(during) >= 50, (len(during), end - start)
    p50, p99 = float(np.percentile(during, 50)), float(np.percentile(during, 99))
    noise_p99 = float(np.percentile(noise, 99))
    reports.append(f"{what}: /health p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms (max {during.max() * 1e3:.1f}) "
                   f"over {len(during)} samples in {end - start:.1f} s; idle server meanwhile p99 "
                   f"{noise_p99 * 1e3:.1f} ms")
    print(reports[-1])
    return p99 < 0.050 + noise_p99


@pytest.mark.xdist_group("timing")  # p99 latency: in the serial pass (conftest.py)
def test_health_p99_stays_under_50ms_while_the_largest_request_is_worked_on(ort_bundle, idle_server, tmp_path):
    """The largest request the defaults allow (256 strings filling the 8 MB body) is parsed, tokenized and
    encoded off the event loop: /health, polled every 10 ms meanwhile, answers within 50 ms at p99 (the
    issue's bound) — beyond what an idle server on the same machine takes over the same seconds, which is
    the machine's own scheduling noise (2 CPU cores shared with other jobs here). Worked on inline, the
    busy server's p99 was over 4 s."""
    body = largest_embeddings_body()
    reports = []
    for attempt in range(2):  # a second try only when other jobs on the machine disturbed the first
        with ServerProc([ort_bundle], "--timeout-s", "600", log=tmp_path / f"busy{attempt}.log") as server, \
                HealthProbe(server.url) as probe, HealthProbe(idle_server.url) as control:
            time.sleep(0.5)
            start = time.perf_counter()
            r = httpx.post(server.url + "/v1/embeddings", content=body,
                           headers={"content-type": "application/json"}, timeout=T)
            end = time.perf_counter()
        assert r.status_code == 200, r.text[:500]
        assert len(r.json()["data"]) == 256
        if _within_bound(probe, control, start, end, "/v1/embeddings", reports):
            return
    raise AssertionError("; ".join(reports))


@pytest.fixture(scope="module")
def bomb_llm(tmp_path_factory):
    """A copy of the committed tiny decoder whose chat template is a bomb (10**10 loop steps)."""
    from edgeinfer.testing.llm import with_template_bomb

    return with_template_bomb(tmp_path_factory.mktemp("bomb") / "tiny-bomb")


@pytest.mark.xdist_group("timing")  # p99 latency: in the serial pass (conftest.py)
def test_health_p99_stays_under_50ms_while_the_largest_chat_and_completion_bodies_are_worked_on(bomb_llm, idle_server,
                                                                                                 tmp_path):
    """The largest chat and completion bodies (8 MB), prompts at the characters-vs-context bound (tokenized,
    then refused for their token count) and a chat template bomb are all read, templated and tokenized in
    the helper processes: /health, polled every 10 ms meanwhile from a second client, answers within 50 ms
    at p99 beyond an idle server's p99 over the same seconds (the machine's own noise, as above). On the
    event loop, the 7 MB chat body alone stalled the server for ~48 s."""
    from edgeinfer.testing.llm import model_dir

    bodies = largest_generation_bodies()
    reports = []
    with ServerProc([model_dir(), bomb_llm], "--threads", "1", log=tmp_path / "busy.log") as server:
        models = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
        context = models["tiny-qwen3"]["context"]
        at_bound = "x" * (context * 60 * 2)  # tiny-qwen3's longest token is 60 bytes; the bound allows twice that
        bodies["chat-at-the-bound"] = ("/v1/chat/completions", json.dumps(  # room for the template's own text
            {"model": "tiny-qwen3", "messages": [{"role": "user", "content": at_bound[:-100]}]}).encode())
        bodies["completion-at-the-bound"] = ("/v1/completions", json.dumps(
            {"model": "tiny-qwen3", "prompt": at_bound}).encode())
        bodies["chat-template-bomb"] = ("/v1/chat/completions", json.dumps(
            {"model": "tiny-bomb", "messages": [{"role": "user", "content": "hi"}]}).encode())
        for endpoint in ("/v1/chat/completions", "/v1/completions"):
            for attempt in range(2):  # a second try only when other jobs on the machine disturbed the first
                with HealthProbe(server.url) as probe, HealthProbe(idle_server.url) as control:
                    time.sleep(0.5)
                    start = time.perf_counter()
                    answers = {name: httpx.post(server.url + path, content=body, timeout=T,
                                                headers={"content-type": "application/json"})
                               for name, (path, body) in bodies.items() if path == endpoint}
                    time.sleep(0.5)  # /health keeps being timed for a moment after the last answer
                    end = time.perf_counter()
                for name, r in answers.items():
                    message = r.json()["error"]["message"]
                    assert r.status_code == 400, (name, r.text[:300])
                    words = "chat template of" if "bomb" in name else f"maximum context length is {context}"
                    assert words in message, (name, message)
                    if "at-the-bound" in name:
                        assert "max_tokens is" in message, (name, message)  # tokenized, then refused
                if _within_bound(probe, control, start, end, endpoint, reports):
                    break
            else:
                raise AssertionError("; ".join(reports))


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return slow_bundle(tmp_path_factory.mktemp("slow") / "slow")


@pytest.fixture(scope="module")
def slower(tmp_path_factory):
    """4× the layers of ``slow``: one 4096-row chunk must outlast twice --timeout-s even on a quiet machine
    (on an idle 2-core run the 64-layer chunk finished in under 3 s, before the restart was due)."""
    return slow_bundle(tmp_path_factory.mktemp("slower") / "slower", layers=256)


# the timeout tests' large request is prepared in the HTTP process: a request helper starts (spawned) at the first
# large request, and on a loaded machine that outlasted --timeout-s, so the request timed out before its batch
# reached the worker (a CI run waited 120 s for a restart that had no batch to stop)
NO_HELPERS = ("--request-helpers", "0")


def rows(n: int) -> dict:
    return {"inputs": {"x": np.linspace(-1, 1, 16 * n, dtype=np.float32).reshape(n, 16).round(3).tolist()}}


def test_timed_out_request_stops_its_work_and_later_small_requests_succeed(slow, tmp_path):
    """A request far too long for --timeout-s gets 504; its batch stops between chunks instead of holding the
    only worker for its whole run, so the small requests right after it are answered in time."""
    with ServerProc([slow], "--timeout-s", "2", "--max-inputs", "4096", "--max-batch", "8", *NO_HELPERS,
                    log=tmp_path / "log") as server:
        r = httpx.post(server.url + "/v1/infer", json=rows(4096), timeout=T)  # ~30 s of model time here
        assert r.status_code == 504, r.text[:300]
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, "edgeinfer_batch_size_sum") >= 4096  # it timed out while its batch was running
        codes = [httpx.post(server.url + "/v1/infer", json=rows(1), timeout=T).status_code for _ in range(6)]
        assert codes == [200] * 6, codes
        with cf.ThreadPoolExecutor(4) as ex:
            codes = list(ex.map(lambda n: httpx.post(server.url + "/v1/infer", json=rows(n), timeout=T).status_code,
                                [1, 2, 3, 4, 1, 2, 3, 4]))
        assert codes == [200] * 8, codes
        assert httpx.get(server.url + "/ready").json()["workers"][0]["restarts"] == 0  # stopped, not killed


def test_a_chunk_that_outlasts_its_timeout_gets_its_worker_restarted(slower, tmp_path):
    """One chunk cannot be stopped halfway: when a timed-out batch is still running --timeout-s after it was
    cancelled, its worker is restarted (not counted as a crash), and the server serves on."""
    with ServerProc([slower], "--timeout-s", "1.5", "--max-inputs", "4096", "--max-batch", "4096", *NO_HELPERS,
                    log=tmp_path / "log") as server:
        pid = httpx.get(server.url + "/ready").json()["workers"][0]["pid"]
        assert httpx.post(server.url + "/v1/infer", json=rows(4096), timeout=T).status_code == 504
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, "edgeinfer_batch_size_sum") >= 4096  # it timed out while its batch was running
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            w = httpx.get(server.url + "/ready").json()["workers"][0]
            if w["restarts"] == 1 and w["state"] == "idle":
                break
            time.sleep(0.2)
        assert w["restarts"] == 1 and w["pid"] != pid and w["state"] == "idle", w
        codes = [httpx.post(server.url + "/v1/infer", json=rows(2), timeout=T).status_code for _ in range(4)]
        assert codes == [200] * 4, codes
        text = httpx.get(server.url + "/metrics").text
        assert metric(text, "edgeinfer_worker_crashes_total") == 0  # a stop on purpose, not a crash
    assert "cancelled; restarting it" in server.output()


# --- malformed requests --------------------------------------------------------------------------------


def raw_http(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"NOT-HTTP\r\n\r\n",
], ids=["content-length-text", "content-length-negative", "bad-header", "no-request-line"])
def test_malformed_http_gets_a_json_400_counted_in_metrics(server, request_bytes):
    before = metric(httpx.get(server.url + "/metrics", headers=AUTH).text, "edgeinfer_requests_total",
                    endpoint="malformed", status="400")
    status, headers, body = raw_http(server.url, request_bytes)
    assert status == 400 and headers["content-type"] == "application/json"
    assert strict_json(body)["error"]["code"] == 400
    after = metric(httpx.get(server.url + "/metrics", headers=AUTH).text, "edgeinfer_requests_total",
                   endpoint="malformed", status="400")
    assert after == before + 1


@pytest.mark.parametrize("body, words", [
    (b'{"input": ', "not valid JSON"),
    (b'{"input": "x", "model": "minilm-ort", "dimensions": NaN}', "not valid JSON"),
    (b'\xff\xfe{"input": "x"}', "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
    (b'{"input": "x", "model": "minilm-ort", "encoding_format": 7}', "encoding_format"),
    (b'{"input": {"a": 1}, "model": "minilm-ort"}', "input"),
    (b'"just a string"', "JSON object"),
    (b"", "JSON object"),
])
def test_bad_bodies_get_a_json_400_counted_in_metrics(server, body, words):
    before = metric(httpx.get(server.url + "/metrics", headers=AUTH).text, "edgeinfer_requests_total",
                    endpoint="/v1/embeddings", status="400")
    r = httpx.post(server.url + "/v1/embeddings", content=body, headers={**AUTH, "content-type": "application/json"},
                   timeout=T)
    assert r.status_code == 400 and words in strict_json(r.text)["error"]["message"], r.text[:300]
    after = metric(httpx.get(server.url + "/metrics", headers=AUTH).text, "edgeinfer_requests_total",
                   endpoint="/v1/embeddings", status="400")
    assert after == before + 1


def test_the_same_checks_hold_for_large_bodies_prepared_off_the_loop(server):
    """Bodies above 64 KiB are read in a helper process: its 400s must be the same."""
    pad = " " * (70 * 1024)
    cases = [(b'{"input": ' + pad.encode(), "not valid JSON"),
             (('{"model": "minilm-ort", "input": [' + ", ".join(['"a"'] * 300) + "]}" + pad).encode(),
              "--max-inputs"),
             (('{"model": "log", "inputs": {"x": [[1, 2], [3]]}}' + pad).encode(), "rectangular")]
    for body, words in cases:
        path = "/v1/infer" if b'"inputs"' in body else "/v1/embeddings"
        headers = {**AUTH, "content-type": "application/json"}
        r = httpx.post(server.url + path, content=body, headers=headers, timeout=T)
        assert r.status_code == 400 and words in r.json()["error"]["message"], (words, r.text[:300])


def test_max_inputs_defaults_to_256(server):
    ok = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm-ort", "input": ["a"] * 256}, headers=AUTH,
                    timeout=T)
    assert ok.status_code == 200 and len(ok.json()["data"]) == 256
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm-ort", "input": ["a"] * 257}, headers=AUTH,
                   timeout=T)
    assert r.status_code == 400 and "at most 256" in r.json()["error"]["message"]


# --- numbers that are not numbers ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 1024], ids=["small-answer", "large-answer-encoded-off-loop"])
def test_nan_or_inf_output_is_a_500_naming_it_never_invalid_json(server, n):
    good = np.linspace(0.5, 2.0, n, dtype=np.float32)
    for bad_value, what in ((-1.0, "NaN"), (0.0, "-Inf")):
        bad = good.copy()
        bad[1] = bad_value
        rows = [good, good, bad, good]

        def call(row):
            return httpx.post(server.url + "/v1/infer", json={"model": "log", "inputs": {"x": [row.tolist()]}},
                              headers=AUTH, timeout=T)

        with cf.ThreadPoolExecutor(4) as ex:  # concurrent: likely merged into one batch with the bad row
            results = list(ex.map(call, rows))
        for row, r in zip(rows, results):
            body = strict_json(r.text)
            if row is bad:
                assert r.status_code == 500, (what, r.text[:300])
                assert "output 'y'" in body["error"]["message"] and "NaN or Inf" in body["error"]["message"]
                assert body["error"]["type"] == "server_error"
            else:
                assert r.status_code == 200, r.text[:300]
                got = np.array(body["outputs"]["y"]["data"], dtype=np.float32)[0]
                np.testing.assert_allclose(got, np.log(good), rtol=1e-6)


def test_token_ids_outside_the_vocabulary_are_400(server):
    feeds = minilm.tokenize(["a short sentence"], seq=16)
    vocab = 30522  # all-MiniLM-L6-v2's vocab.txt
    lists = {k: v.tolist() for k, v in feeds.items()}
    for bad in (vocab, 10**6, -1):
        ids = feeds["input_ids"].copy()
        ids[0, 2] = bad
        body = {"model": "minilm-ort", "inputs": {**lists, "input_ids": ids.tolist()}}
        r = httpx.post(server.url + "/v1/infer", json=body, headers=AUTH, timeout=T)
        assert r.status_code == 400, r.text[:300]
        assert str(bad) in r.json()["error"]["message"] and "vocabulary" in r.json()["error"]["message"]
    ids = feeds["input_ids"].copy()
    ids[0, 2] = vocab - 1
    body = {"model": "minilm-ort", "inputs": {**lists, "input_ids": ids.tolist()}}
    assert httpx.post(server.url + "/v1/infer", json=body, headers=AUTH, timeout=T).status_code == 200


def test_api_key_file_is_required_and_not_on_the_command_line(server):
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200
    cmdline = open(f"/proc/{server.proc.pid}/cmdline", "rb").read()
    assert KEY.encode() not in cmdline


def test_a_killed_helper_fails_only_its_request_and_helpers_come_back(server):
    """Helpers start with the first large request (none before, unless an earlier test sent one). Killing
    them (as an out-of-memory kill would) fails the large request in flight or next with a JSON 500; helpers
    are started again and the next large request is answered."""
    import os
    import signal

    worker = httpx.get(server.url + "/ready", headers=AUTH).json()["workers"][0]["pid"]
    tasks = f"/proc/{server.proc.pid}/task"

    def helpers() -> list[int]:
        children = [p for t in os.listdir(tasks) for p in open(f"{tasks}/{t}/children").read().split()]
        return [int(p) for p in children
                if int(p) != worker and b"spawn_main" in open(f"/proc/{p}/cmdline", "rb").read()]

    big = {"model": "minilm-ort", "input": ["a sentence long enough to matter " * 40] * 64}  # > 64 KiB
    started = httpx.post(server.url + "/v1/embeddings", json=big, headers=AUTH, timeout=T)
    assert started.status_code == 200, started.text[:300]
    running = helpers()
    assert 1 <= len(running) <= 2, running  # --request-helpers 2: started one per large request in flight
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    first = httpx.post(server.url + "/v1/embeddings", json=big, headers=AUTH, timeout=T)
    assert first.status_code in (200, 500), first.text[:300]
    if first.status_code == 500:
        assert "helper process" in first.json()["error"]["message"]
    again = httpx.post(server.url + "/v1/embeddings", json=big, headers=AUTH, timeout=T)
    assert again.status_code == 200 and len(again.json()["data"]) == 64, again.text[:300]
    assert helpers() and not set(helpers()) & set(running)
