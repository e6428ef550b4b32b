"""One ``edgeinfer serve`` carrying a retrieval chain (issue 31 §2): an embedding bundle, a reranker, a
classifier and a decoder in one process, behind an API key. ``/v1/rerank`` is driven with the request
shapes of Cohere's rerank API (https://docs.cohere.com/reference/rerank: ``model``, ``query``, ``documents``
as strings, ``top_n``; v1 also took documents as objects with ``text``) and Jina's
(https://jina.ai/reranker/: ``return_documents`` echoes each document as ``{"text": ...}``), ``/v1/classify``
with vLLM's (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html, classification API:
``model``, ``input`` → ``data`` with ``label``, ``probs``, ``num_classes``). Scores are checked against
onnxruntime run directly on each bundle's artifact."""

from __future__ import annotations

import concurrent.futures as cf
import math
import re

import httpx
import numpy as np
import pytest
from scoring_bundles import (  # noqa: F401 - fixtures
    LABELS,
    classifier_host_bundle,
    direct_logits,
    reranker_host_bundle,
)

from edgeinfer.testing.fixtures import DECODER_BUNDLE_CTX
from edgeinfer.testing.serve import ServerProc, minilm_bundle

pytestmark = pytest.mark.slow  # deploys the scoring bundles and starts a real server with four models

KEY = "chain-key"
MAX_BATCH = 8  # rows an encoder runs at once (--max-batch): the plan's batch, reached by one --max-inputs request
AUTH = {"Authorization": f"Bearer {KEY}"}
QUERY = "How do I sort a list in place?"
DOCS = ["The list is sorted in place by its sort method.", "A socket connects two processes over a network.",
        "Return a new sorted list from the items in an iterable.", "The queue module implements queues."]


@pytest.fixture(scope="module")
def chain(minilm_onnx, reranker_host_bundle, classifier_host_bundle, tiny_qwen3_host_bundle,  # noqa: F811
          tmp_path_factory):
    emb = minilm_bundle(minilm_onnx, tmp_path_factory.getbasetemp() / "serve-bundles" / "minilm-ort", "onnxruntime")
    log = tmp_path_factory.mktemp("serve-chain") / "server.log"
    server = ServerProc([emb, reranker_host_bundle, classifier_host_bundle, tiny_qwen3_host_bundle],
                        "--api-key", KEY, "--max-inputs", "8", "--max-batch", str(MAX_BATCH), "--max-body-mb", "1",
                        "--batch-window-ms", "100",
                        "--threads", "1", log=log, wait_ready=False)
    try:
        server.wait_ready(headers=AUTH)
        yield server, {"emb": emb.name, "reranker": reranker_host_bundle.name,
                       "classifier": classifier_host_bundle.name, "llm": tiny_qwen3_host_bundle.name}
    finally:
        assert server.terminate() == 0, server.output()[-2000:]


def post(server: ServerProc, path: str, body: dict, headers: dict | None = AUTH) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_chain_plan_within_ten_percent_of_the_served_peak(chain, reranker_dir, classifier_dir):
    """The peak RSS (VmHWM) of the server's processes (HTTP process, encoder worker, decoder worker, resource
    tracker; not the request helper a chat request starts, which the plan does not count: docs/planner.md)
    against the chain plan computed independently of serve: ``edgeinfer plan``'s
    :func:`edgeinfer.planning.chain_plan.plan_chain` on the models the bundles were made from, at the bundles'
    schemes and serve's settings (``--max-batch`` rows of 128 tokens an encoder, ``--slots`` 4 of ctx 256), the OS
    reserve left out (a measured process holds none). Runs first in this file, so that the peak is that of the
    planned maxima (one full batch of the longest texts to each encoder model, and a chat), not of the other
    tests' concurrent requests: the bodies in flight in the HTTP process are not planned, and on a loaded CI
    machine they raised its peak from ~107 to 137 MiB. The lower bound is 0.85, not 0.9: on a fresh clone (CI) the
    libraries of the new virtual environment were just written, so the page cache holds them in large folios and
    every process maps more of them — 12 MiB more RssFile for the same imports (onnxruntime, numpy, edgeinfer)
    than in a long-lived environment, where the runtime overheads were measured. The chain reads 0.96 there,
    0.92 on a fresh clone, 0.8995 on a fresh clone under CI's parallel load (docs/planner.md)."""
    import psutil

    from edgeinfer.planning.chain_plan import Entry, plan_chain
    from edgeinfer.testing import minilm
    from edgeinfer.testing.llm import model_dir

    server, names = chain
    long = [" ".join(["memory"] * 200) + f" {i}" for i in range(MAX_BATCH)]  # past the 128-token limit: truncated
    assert post(server, "/v1/embeddings", {"model": names["emb"], "input": long}).status_code == 200
    assert post(server, "/v1/rerank", {"model": names["reranker"], "query": long[0],
                                       "documents": long}).status_code == 200
    assert post(server, "/v1/classify", {"model": names["classifier"], "input": long}).status_code == 200
    chat = post(server, "/v1/chat/completions", {"model": names["llm"], "max_tokens": 4, "messages": [
        {"role": "user", "content": " ".join(["memory"] * 70)}]})
    assert chat.status_code == 200, chat.text
    ready = httpx.get(server.url + "/ready", headers=AUTH).json()
    counted = {server.proc.pid, *(w["pid"] for w in ready["workers"]), *(d["pid"] for d in ready["decoders"])}
    counted |= {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)
                if "resource_tracker" in " ".join(p.cmdline())}
    measured = sum(_hwm(pid) for pid in counted)
    enc = {"quant": "fp32", "runtime": "onnxruntime", "batch": MAX_BATCH}
    plan = plan_chain([Entry(str(minilm.model_dir()), enc), Entry(str(reranker_dir), enc),
                       Entry(str(classifier_dir), enc), Entry(str(model_dir()), {"ctx": DECODER_BUNDLE_CTX})], "host")
    planned = plan.total_bytes - plan.reserved_bytes
    assert len(counted) == 4 and plan.fits, counted
    assert 0.85 <= planned / measured <= 1.1, {"planned_mib": planned / 2**20, "measured_mib": measured / 2**20,
                                              "processes": {pid: _hwm(pid) / 2**20 for pid in counted},
                                              "plan": [(p.name, p.total_bytes / 2**20) for p in plan.processes]}


def test_one_server_carries_the_chain_and_routes_by_model(chain):
    server, names = chain
    listed = {m["id"]: m.get("endpoints") for m in httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"]}
    assert listed[names["reranker"]] == ["/v1/rerank", "/v1/infer"]
    assert listed[names["classifier"]] == ["/v1/classify", "/v1/infer"]
    assert listed[names["emb"]] == ["/v1/embeddings", "/v1/infer"] and names["llm"] in listed
    vec = post(server, "/v1/embeddings", {"model": names["emb"], "input": ["a sentence"]})
    assert vec.status_code == 200 and len(vec.json()["data"][0]["embedding"]) == 384
    chat = post(server, "/v1/chat/completions", {"model": names["llm"], "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] is not None
    wrong = post(server, "/v1/embeddings", {"model": names["reranker"], "input": "x"})
    assert wrong.status_code == 400 and "/v1/rerank" in wrong.json()["error"]["message"]
    wrong = post(server, "/v1/rerank", {"model": names["emb"], "query": "q", "documents": ["d"]})
    assert wrong.status_code == 400 and "not a reranker" in wrong.json()["error"]["message"]
    wrong = post(server, "/v1/classify", {"model": names["llm"], "input": "x"})
    assert wrong.status_code == 400 and "/v1/chat/completions" in wrong.json()["error"]["message"]


def test_rerank_in_cohere_and_jina_shapes(chain, reranker_host_bundle):  # noqa: F811
    server, names = chain
    want = [sigmoid(x) for x in direct_logits(reranker_host_bundle, [(QUERY, d) for d in DOCS])[:, 0]]
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    cohere = post(server, "/v1/rerank", {"model": names["reranker"], "query": QUERY, "documents": DOCS, "top_n": 3})
    assert cohere.status_code == 200, cohere.text
    body = cohere.json()
    assert body["model"] == names["reranker"] and body["usage"]["total_tokens"] > 0
    assert [r["index"] for r in body["results"]] == order[:3]
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx([want[i] for i in order[:3]], abs=1e-4)
    assert all("document" not in r for r in body["results"])
    jina = post(server, "/v1/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCS],
                                       "return_documents": True})  # the only reranker: model may be left out
    assert [(r["index"], r["document"]) for r in jina.json()["results"]] == [(i, {"text": DOCS[i]}) for i in order]


def test_cohere_clients_rerank_through_the_server(chain, reranker_host_bundle):  # noqa: F811
    """Cohere's own Python client (requirements-dev.txt), pointed at the server with ``base_url``: its v1
    ``Client`` posts to /v1/rerank, its current ``ClientV2`` to /v2/rerank."""
    cohere = pytest.importorskip("cohere")
    server, names = chain
    want = [sigmoid(x) for x in direct_logits(reranker_host_bundle, [(QUERY, d) for d in DOCS])[:, 0]]
    order = sorted(range(len(DOCS)), key=lambda i: -want[i])
    v1 = cohere.Client(api_key=KEY, base_url=server.url, timeout=120)
    r = v1.rerank(model=names["reranker"], query=QUERY, documents=DOCS, top_n=2, return_documents=True)
    assert [(x.index, x.document.text) for x in r.results] == [(i, DOCS[i]) for i in order[:2]]
    assert [x.relevance_score for x in r.results] == pytest.approx([want[i] for i in order[:2]], abs=1e-4)
    v2 = cohere.ClientV2(api_key=KEY, base_url=server.url, timeout=120)
    assert [x.index for x in v2.rerank(model=names["reranker"], query=QUERY, documents=DOCS).results] == order
    stranger = cohere.Client(api_key="wrong", base_url=server.url)
    with pytest.raises(cohere.core.api_error.ApiError) as refused:  # the key is checked as on every endpoint
        stranger.rerank(model=names["reranker"], query="q", documents=["d"])
    assert refused.value.status_code == 401


def test_classify_in_vllm_shape(chain, classifier_host_bundle):  # noqa: F811
    server, names = chain
    texts = [DOCS[0], DOCS[3]]
    logits = direct_logits(classifier_host_bundle, texts)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    r = post(server, "/v1/classify", {"model": names["classifier"], "input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == names["classifier"]
    for i, (d, row) in enumerate(zip(body["data"], probs)):
        assert (d["index"], d["num_classes"], d["label"]) == (i, len(LABELS), LABELS[int(np.argmax(row))])
        assert d["probs"] == pytest.approx(row.tolist(), abs=1e-4)
    one = post(server, "/v1/classify", {"input": texts[1]})  # a bare string is a list of one
    assert one.json()["data"][0]["probs"] == pytest.approx(probs[1].tolist(), abs=1e-4)


def test_concurrent_reranks_merge_into_batches_and_each_gets_its_own_answer(chain):
    server, names = chain
    queries = [QUERY, "network sockets", "queues between threads", "sorting"]

    def ask(q: str) -> list[int]:
        r = post(server, "/v1/rerank", {"model": names["reranker"], "query": q, "documents": DOCS})
        assert r.status_code == 200, r.text
        return [x["index"] for x in r.json()["results"]]

    solo = [ask(q) for q in queries]
    before = _metric(server, "edgeinfer_batch_requests_count", names["reranker"])
    with cf.ThreadPoolExecutor(len(queries)) as pool:
        together = list(pool.map(ask, queries))
    assert together == solo
    runs = _metric(server, "edgeinfer_batch_requests_count", names["reranker"]) - before
    assert runs < len(queries), "no two concurrent requests were merged into one model run"


def test_limits_errors_and_api_key_as_embeddings(chain):
    server, names = chain
    body = {"model": names["reranker"], "query": "q", "documents": ["d"]}
    assert post(server, "/v1/rerank", body, headers=None).status_code == 401
    many = post(server, "/v1/rerank", {**body, "documents": ["d"] * 9})
    assert many.status_code == 400 and "at most 8 per request (--max-inputs)" in many.json()["error"]["message"]
    assert post(server, "/v1/rerank", {**body, "documents": ["d" * (1 << 20)]}).status_code == 413
    for bad, field in (({**body, "top_n": 0}, "top_n"), ({**body, "query": ""}, "query"),
                       ({**body, "rank_fields": ["x"]}, "rank_fields"), ({**body, "documents": []}, "documents"),
                       ({**body, "documents": [1]}, "documents"),
                       ({**body, "documents": [{"title": "x"}]}, "documents"),
                       ({**body, "return_documents": "yes"}, "return_documents")):
        r = post(server, "/v1/rerank", bad)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), r.text
    everything = post(server, "/v1/rerank", {**body, "documents": ["a", "b"], "top_n": 100})
    assert sorted(r["index"] for r in everything.json()["results"]) == [0, 1]  # top_n past the documents: all
    r = post(server, "/v1/classify", {"model": names["classifier"], "input": []})
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]


def test_metrics_per_model(chain):
    server, names = chain
    post(server, "/v1/rerank", {"query": "q", "documents": ["d"]})
    post(server, "/v1/classify", {"input": "x"})
    post(server, "/v1/embeddings", {"model": names["emb"], "input": "x"})
    for model, endpoint in ((names["reranker"], "/v1/rerank"), (names["classifier"], "/v1/classify"),
                            (names["emb"], "/v1/embeddings")):
        assert _metric(server, "edgeinfer_model_requests_total", model, endpoint) >= 1
        assert _metric(server, "edgeinfer_batch_size_count", model) >= 1
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'edgeinfer_requests_total{endpoint="/v1/rerank",status="200"}' in text


def _hwm(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _metric(server: ServerProc, name: str, model: str, endpoint: str | None = None) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    labels = f'endpoint="{endpoint}",model="{model}"' if endpoint else f'model="{model}"'
    m = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0
