"""``edgeinfer serve`` with a real server on loopback, serving real MiniLM bundles (OpenVINO and onnxruntime)."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json

import httpx
import numpy as np
import pytest

from edgeinfer.model.bundle import Bundle
from edgeinfer.run.bundle import embed, open_session, tokenize_texts
from edgeinfer.testing import minilm
from edgeinfer.testing.serve import ServerProc, minilm_bundle, rss_kib, runtime_libraries

pytestmark = pytest.mark.slow  # converts MiniLM twice and starts real servers

TIMEOUT = httpx.Timeout(60.0)


@pytest.fixture(scope="session")
def bundles(minilm_onnx, minilm_onnx_static, tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "serve-bundles"  # shared with test_serve_lifecycle.py
    return {
        "ov": minilm_bundle(minilm_onnx, root / "minilm-ov", "openvino"),
        "ort": minilm_bundle(minilm_onnx, root / "minilm-ort", "onnxruntime"),
        "static": minilm_bundle(minilm_onnx_static, root / "minilm-static", "onnxruntime"),  # [1, 128]
    }


@pytest.fixture(scope="module")
def server(bundles, tmp_path_factory):
    """Both bundles, two workers, a wide window so concurrent requests surely merge, 1 MiB body limit."""
    log = tmp_path_factory.mktemp("serve-main") / "server.log"
    with ServerProc([bundles["ov"], bundles["ort"], bundles["static"]], "--devices", "CPU,CPU", "--batch-window-ms",
                    "40",
                    "--max-batch", "16", "--max-body-mb", "1", log=log) as s:
        yield s


def test_the_http_process_maps_no_runtime_library(server):
    """The OpenVINO and onnxruntime libraries are the embedding workers' alone (issue 30, footprint)."""
    assert runtime_libraries(server.proc.pid) == []


def test_the_http_process_never_holds_a_models_weights(server, bundles):
    """The HTTP process reads the embedding tables' sizes (the id limits it checks requests against) without
    reading the weights: its peak stays within half a model's weights of what it holds now. Reading each of its
    three models with ``onnx.load`` put about two copies of the weights on its peak (257 vs 91 MiB resident)."""
    weights = (bundles["ort"] / "model.onnx").stat().st_size
    mem = rss_kib(server.proc.pid)
    assert (mem["VmHWM"] - mem["VmRSS"]) * 1024 < weights / 2, (mem, weights)


def test_recorded_index_limits_are_read_from_the_manifest_not_the_model(bundles, monkeypatch):
    """A bundle whose manifest records its id limits (deploy writes them) is not opened to find them; one
    deployed before (no record) is read from its ONNX graph: MiniLM's vocabulary and token types."""
    from edgeinfer.planning.models import onnx as onnx_reader
    from edgeinfer.run.once import token_id_limits

    b = Bundle.open(bundles["ort"])
    cfg = json.loads((minilm.model_dir() / "config.json").read_text())
    assert b.manifest.index_limits is None
    assert token_id_limits(b.path, b) == {"input_ids": cfg["vocab_size"], "token_type_ids": cfg["type_vocab_size"]}
    recorded = Bundle(b.path, b.manifest.model_copy(update={"index_limits": {"input_ids": 7, "token_type_ids": 1}}))

    def read(path):
        raise AssertionError(f"{path} was read")

    monkeypatch.setattr(onnx_reader, "index_limits", read)
    assert token_id_limits(b.path, recorded) == {"input_ids": 7, "token_type_ids": 1}


@pytest.fixture(scope="module")
def direct_ov(bundles):
    b = Bundle.open(bundles["ov"])
    with open_session(b) as s:
        yield b, s


@pytest.fixture(scope="module")
def direct_ort(bundles):
    b = Bundle.open(bundles["ort"])
    with open_session(b) as s:
        yield b, s


def post(url: str, path: str, body, client: httpx.Client | None = None, **kw) -> httpx.Response:
    c = client or httpx
    return c.post(url + path, json=body, timeout=TIMEOUT, **kw)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- answers ------------------------------------------------------------------------------------------


def test_every_embedding_request_answered_once_and_equal_to_a_direct_run(server, direct_ov):
    bundle, session = direct_ov
    sents = minilm.heldout_sentences(40)
    jobs = [(f"req-{i}", sents[i % 40 : i % 40 + 1 + i % 3]) for i in range(48)]
    before = httpx.get(server.url + "/metrics").text

    def call(job):
        rid, texts = job
        r = post(server.url, "/v1/embeddings", {"input": texts, "model": "minilm-ov"}, headers={"X-Request-Id": rid})
        return rid, texts, r

    with cf.ThreadPoolExecutor(16) as ex:
        results = list(ex.map(call, jobs))
    seen = [r.headers["x-request-id"] for _, _, r in results]
    assert sorted(seen) == sorted(rid for rid, _ in jobs)  # each id answered exactly once
    for rid, texts, r in results:
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == "minilm-ov"
        assert [d["index"] for d in body["data"]] == list(range(len(texts)))
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        feeds = tokenize_texts(bundle, texts)
        want = embed(bundle, session.run(feeds), feeds)
        np.testing.assert_allclose(got, want, atol=2e-4, err_msg=rid)
        # usage counts the real tokens, from the tokenizer itself
        assert body["usage"]["prompt_tokens"] == int(minilm.tokenize(texts)["attention_mask"].sum())
    after = httpx.get(server.url + "/metrics").text
    runs = metric(after, "edgeinfer_batch_requests_count", model="minilm-ov") - metric(
        before, "edgeinfer_batch_requests_count", model="minilm-ov")
    merged = metric(after, "edgeinfer_batch_requests_sum", model="minilm-ov") - metric(
        before, "edgeinfer_batch_requests_sum", model="minilm-ov")
    assert merged == len(jobs)
    assert runs < len(jobs), "no two concurrent requests were merged into one run"
    workers = httpx.get(server.url + "/ready").json()["workers"]
    assert len(workers) == 2 and all(w["batches"] > 0 for w in workers), workers  # both workers got work


def test_infer_outputs_equal_a_direct_session_run(server, direct_ort):
    _, session = direct_ort
    sents = minilm.heldout_sentences(40)
    jobs = []
    for i in range(24):
        seq = (16, 32)[i % 2]  # two shapes: only same-shape requests merge
        feeds = minilm.tokenize(sents[i : i + 1 + i % 2], seq=seq)
        jobs.append((f"infer-{i}", feeds))

    def call(job):
        rid, feeds = job
        body = {"model": "minilm-ort", "id": rid, "inputs": {k: v.tolist() for k, v in feeds.items()}}
        return rid, feeds, post(server.url, "/v1/infer", body)

    with cf.ThreadPoolExecutor(12) as ex:
        results = list(ex.map(call, jobs))
    assert sorted(r.json()["id"] for _, _, r in results) == sorted(j[0] for j in jobs)
    for rid, feeds, r in results:
        assert r.status_code == 200, r.text
        out = r.json()["outputs"]["last_hidden_state"]
        want = session.run(feeds)["last_hidden_state"]
        assert out["shape"] == list(want.shape) and out["dtype"] == "float32"
        np.testing.assert_allclose(np.array(out["data"], dtype=np.float32), want, atol=1e-4, err_msg=rid)


def test_base64_encoding_is_the_same_vector(server):
    body = {"input": "Return the absolute value of a number.", "model": "minilm-ov"}
    plain = post(server.url, "/v1/embeddings", body).json()["data"][0]["embedding"]
    b64 = post(server.url, "/v1/embeddings", {**body, "encoding_format": "base64"}).json()["data"][0]["embedding"]
    vec = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    np.testing.assert_allclose(vec, np.array(plain, dtype=np.float32), atol=1e-6)
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4  # the manifest says normalize


def test_models_health_ready_metrics_openapi(server):
    models = httpx.get(server.url + "/v1/models").json()
    by_id = {m["id"]: m for m in models["data"]}
    assert set(by_id) == {"minilm-ov", "minilm-ort", "minilm-static"}
    assert by_id["minilm-ov"]["backend"] == "openvino" and by_id["minilm-ort"]["backend"] == "onnxruntime"
    assert "/v1/embeddings" in by_id["minilm-ov"]["endpoints"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/ready").json()["ready"] is True
    # the batch histograms have samples only once a batch ran: send one here, so the test stands alone
    assert post(server.url, "/v1/embeddings", {"input": ["a batch of one"], "model": "minilm-ort"}).status_code == 200
    text = httpx.get(server.url + "/metrics").text
    for family in ("edgeinfer_requests_total", "edgeinfer_request_latency_seconds_bucket",
                   "edgeinfer_batch_size_bucket",
                   "edgeinfer_queue_depth", "edgeinfer_worker_up", "edgeinfer_worker_memory_bytes"):
        assert family in text, family
    assert metric(text, "edgeinfer_worker_up") == 2
    assert metric(text, "edgeinfer_worker_memory_bytes") > 10e6  # a loaded MiniLM worker
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert {"/v1/embeddings", "/v1/infer", "/v1/models", "/health", "/ready", "/metrics"} <= set(paths)


def test_static_batch_bundle_merges_rows_and_runs_them_padded(server, bundles):
    """A [1, 128] bundle (as NPUs need): merged requests run in chunks of the static batch, split back."""
    from edgeinfer.run.padding import run_padded

    b = Bundle.open(bundles["static"])
    sents = minilm.heldout_sentences(12)
    jobs = [sents[i : i + 1 + i % 3] for i in range(8)]
    before = httpx.get(server.url + "/metrics").text
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda t: post(server.url, "/v1/embeddings", {"input": t, "model": "minilm-static"}),
                              jobs))
    after = httpx.get(server.url + "/metrics").text
    with open_session(b) as session:
        for texts, r in zip(jobs, results):
            assert r.status_code == 200, r.text
            feeds = tokenize_texts(b, texts)
            want = embed(b, run_padded(session, feeds), feeds)
            np.testing.assert_allclose(np.array([d["embedding"] for d in r.json()["data"]]), want, atol=2e-4)
    rows = metric(after, "edgeinfer_batch_size_sum", model="minilm-static") - metric(
        before, "edgeinfer_batch_size_sum", model="minilm-static")
    runs = metric(after, "edgeinfer_batch_size_count", model="minilm-static") - metric(
        before, "edgeinfer_batch_size_count", model="minilm-static")
    assert rows == sum(len(j) for j in jobs) and runs < len(jobs)  # several requests per dispatched batch


# --- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, words",
    [
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"nope": [[1]]}}, "unknown input 'nope'"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [[101, 102]]}}, "missing input"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [101], "attention_mask": [1],
                                                          "token_type_ids": [0]}}, "expected shape"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [[1.5]], "attention_mask": [[1]],
                                                          "token_type_ids": [[0]]}}, "whole numbers"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [[1, 2], [3]], "attention_mask": [[1]],
                                                          "token_type_ids": [[0]]}}, "rectangular"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [["a"]], "attention_mask": [[1]],
                                                          "token_type_ids": [[0]]}}, "numbers"),
        ("/v1/infer", {"model": "minilm-ort", "inputs": {"input_ids": [[10**30]], "attention_mask": [[1]],
                                                          "token_type_ids": [[0]]}}, "range"),
        ("/v1/embeddings", {"input": [], "model": "minilm-ov"}, "at least one"),
        ("/v1/embeddings", {"input": [1, 2], "model": "minilm-ov"}, "input"),
        ("/v1/embeddings", {"input": "x"}, "several models"),
        ("/v1/infer", {"model": "minilm-static", "inputs": {"input_ids": [[1] * 16], "attention_mask": [[1] * 16],
                                                             "token_type_ids": [[0] * 16]}}, "expected shape"),
        ("/v1/embeddings", {"input": "x", "model": "minilm-ov", "dimensions": 7}, "dimensions"),
    ],
)
def test_bad_requests_get_400_with_a_json_error(server, path, body, words):
    r = post(server.url, path, body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_malformed_json_unknown_model_and_oversized_body(server):
    r = httpx.post(server.url + "/v1/embeddings", content=b'{"input": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = post(server.url, "/v1/embeddings", {"input": "x", "model": "nope"})
    assert r.status_code == 404 and "minilm-ov" in r.json()["error"]["message"]
    big = {"input": ["word " * 1000] * 300, "model": "minilm-ov"}  # ~1.5 MB > --max-body-mb 1
    r = post(server.url, "/v1/embeddings", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    assert httpx.get(server.url + "/health").status_code == 200


def test_out_of_range_token_type_gets_400_alone_and_the_server_keeps_serving(server, direct_ort):
    """MiniLM has two token types: a request with type 7 is refused with a 400 saying the range (onnxruntime
    would fail the Gather with a 500), and the requests sent with it are answered as usual. (Token ids are
    checked against the tokenizer's vocabulary: tests/test_serve_responsive.py.)"""
    _, session = direct_ort
    good = minilm.tokenize(minilm.heldout_sentences(6), seq=16)
    bad = {k: v[:1].copy() for k, v in good.items()}
    bad["token_type_ids"][0, 3] = 7

    def call(i):
        feeds = bad if i == 0 else {k: v[i - 1 : i] for k, v in good.items()}
        return i, post(server.url, "/v1/infer", {"model": "minilm-ort", "inputs": {k: v.tolist() for k,
                                                                                   v in feeds.items()}})

    with cf.ThreadPoolExecutor(7) as ex:
        results = dict(ex.map(call, range(7)))
    assert results[0].status_code == 400, results[0].text
    assert results[0].json()["error"]["message"] == ("input 'token_type_ids': token type 7 is outside the token "
                                                     "types of minilm-ort (0..1)")
    bad["token_type_ids"][0, 3] = -1
    r = post(server.url, "/v1/infer", {"model": "minilm-ort", "inputs": {k: v.tolist() for k, v in bad.items()}})
    assert r.status_code == 400 and "token type -1 is outside" in r.json()["error"]["message"], r.text
    bad["token_type_ids"][0, 3] = 2  # an OpenVINO IR holds no ONNX graph: the range is the tokenizer's types
    r = post(server.url, "/v1/infer", {"model": "minilm-ov", "inputs": {k: v.tolist() for k, v in bad.items()}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "input 'token_type_ids': token type 2 is outside the token types of " \
                                           "minilm-ov (0..1)"
    want = session.run(good)["last_hidden_state"]
    for i in range(1, 7):
        assert results[i].status_code == 200, results[i].text
        got = np.array(results[i].json()["outputs"]["last_hidden_state"]["data"], dtype=np.float32)
        np.testing.assert_allclose(got[0], want[i - 1], atol=1e-4)
    assert post(server.url, "/v1/embeddings", {"input": "still here", "model": "minilm-ov"}).status_code == 200


# --- fuzzing against the OpenAPI document ----------------------------------------------------------------


def test_fuzzed_bodies_never_get_a_5xx(server):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    doc = httpx.get(server.url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]

    def resolve(s):
        while "$ref" in s:
            s = schemas[s["$ref"].rsplit("/", 1)[1]]
        return s

    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
        max_leaves=20,
    )

    def from_schema(s, depth=0):
        s = resolve(s)
        if depth > 4:
            return json_values
        if "anyOf" in s:
            return st.one_of([from_schema(x, depth + 1) for x in s["anyOf"]] + [json_values])
        t = s.get("type")
        if "enum" in s:
            return st.sampled_from(s["enum"]) | json_values
        if t == "string":
            return st.text(max_size=60)
        if t == "integer":
            return st.integers(-5, 2000)
        if t == "number":
            return st.floats(allow_nan=False)
        if t == "array":
            return st.lists(from_schema(s.get("items", {}), depth + 1), max_size=6)
        if t == "object":
            props = s.get("properties", {})
            if not props:  # free-form maps, e.g. /v1/infer inputs: use the model's real input names
                names = st.sampled_from(["input_ids", "attention_mask", "token_type_ids", "x"])
                grids = st.lists(st.lists(st.integers(-3, 40000), min_size=1, max_size=4), min_size=1, max_size=3)
                return st.dictionaries(names, grids | json_values, max_size=4)
            required = set(s.get("required", []))
            return st.fixed_dictionaries(
                {k: from_schema(v, depth + 1) for k, v in props.items() if k in required},
                optional={k: from_schema(v, depth + 1) for k, v in props.items() if k not in required},
            )
        return json_values

    bodies = []
    for path, ops in doc["paths"].items():
        post_op = ops.get("post")
        if not post_op:
            continue
        schema = post_op["requestBody"]["content"]["application/json"]["schema"]
        model_names = st.sampled_from(["minilm-ov", "minilm-ort", "nope"]) | st.none()
        body = from_schema(schema).map(lambda b: b)
        shaped = st.tuples(body, model_names).map(lambda t: {**t[0], "model": t[1]} if isinstance(t[0],
                                                                                                  dict) else t[0])
        bodies.append(st.tuples(st.just(path), shaped | json_values))
    # no reranker or classifier is served here: their endpoints answer 400, never 5xx
    posts = ["/v1/embeddings", "/v1/rerank", "/v2/rerank", "/v1/classify", "/v1/infer"]
    assert {p for p, _ in [(b, None) for b in doc["paths"] if "post" in doc["paths"][b]]} == set(posts)
    raw = st.tuples(st.sampled_from(posts), st.binary(max_size=64))
    client = httpx.Client(timeout=TIMEOUT)
    statuses = set()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=st.one_of(*bodies) | raw.map(lambda t: (t[0], t[1])))
    def check(case):
        path, body = case
        if isinstance(body, bytes):
            r = client.post(server.url + path, content=body, headers={"content-type": "application/json"})
        else:
            r = client.post(server.url + path, content=json.dumps(body).encode(),
                            headers={"content-type": "application/json"})
        statuses.add(r.status_code)
        assert r.status_code < 500, (path, body, r.status_code, r.text)
        assert "error" in r.json() if r.status_code >= 400 else True

    check()
    client.close()
    assert 400 in statuses and 200 in statuses  # the fuzzer reached both the checks and the model
    assert httpx.get(server.url + "/ready").status_code == 200
