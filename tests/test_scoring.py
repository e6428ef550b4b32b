"""Rerankers and classifiers at run time (issue 31 §1): `edgeinfer run` / `bench` on a bundle with a task section
(in this process), scores checked against onnxruntime run directly on the bundle's artifact with the bundle's
tokenizer; and the scoring rules themselves."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scoring_bundles import (  # noqa: F401 - fixtures
    LABELS,
    classifier_host_bundle,
    direct_logits,
    reranker_host_bundle,
)

from edgeinfer.errors import InputError, ModelError
from edgeinfer.model.bundle import Bundle, TaskSpec
from edgeinfer.run import scoring
from edgeinfer.testing.cli import in_process_cli

cli, _bind_capfd = in_process_cli()

slow = pytest.mark.slow  # the tests taking a fixture deploy a reranker and a classifier (MiniLM) for the host board

QUERY = "How do I sort a list in place?"
DOCS = ["The list is sorted in place by its sort method.", "A socket connects two processes over a network.",
        "Return a new sorted list from the items in an iterable.", "The queue module implements queues."]


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _error(proc) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@slow
def test_run_reranks_documents_best_first_with_sigmoid_scores(reranker_host_bundle, tmp_path):  # noqa: F811
    docs_file = tmp_path / "docs.txt"
    docs_file.write_text("\n".join(DOCS[1:]) + "\n\n")  # a blank line is no document
    report = _json(cli("run", str(reranker_host_bundle), "--query", QUERY, "--document", DOCS[0],
                       "--documents", str(docs_file), "--json"))
    want = [1 / (1 + math.exp(-x)) for x in direct_logits(reranker_host_bundle, [(QUERY, d) for d in DOCS])[:, 0]]
    got = report["results"]
    assert report["task"] == "rerank" and len(got) == len(DOCS)
    assert [r["index"] for r in got] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for r in got:
        assert r["document"] == DOCS[r["index"]]
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-4)
    text = cli("run", str(reranker_host_bundle), "--query", QUERY, "--document", DOCS[0], "--document", DOCS[1])
    assert text.returncode == 0 and "#1 document[" in text.stdout and "#2 document[" in text.stdout


@slow
def test_run_classifies_texts_with_softmax_over_the_labels(classifier_host_bundle):  # noqa: F811
    texts = [DOCS[0], DOCS[3]]
    report = _json(cli("run", str(classifier_host_bundle), "--text", texts[0], "--text", texts[1], "--json"))
    logits = direct_logits(classifier_host_bundle, texts)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert report["task"] == "classify" and len(report["predictions"]) == 2
    for p, row in zip(report["predictions"], probs):
        assert [s["label"] for s in p["scores"]] == LABELS
        assert [s["score"] for s in p["scores"]] == pytest.approx(row.tolist(), abs=1e-4)
        assert p["label"] == LABELS[int(np.argmax(row))] and p["score"] == pytest.approx(row.max(), abs=1e-4)


@slow
def test_run_refuses_the_wrong_input_for_the_task_in_one_line(reranker_host_bundle, classifier_host_bundle):  # noqa: F811
    assert "is a reranker, not a classifier; give it --query and --document" in _error(
        cli("run", str(reranker_host_bundle), "--text", "hello"))
    assert "is a classifier, not a reranker; give it --text" in _error(
        cli("run", str(classifier_host_bundle), "--query", "q", "--document", "d"))
    assert "--document needs --query" in _error(cli("run", str(reranker_host_bundle), "--document", "d"))
    assert "no documents to rerank" in _error(cli("run", str(reranker_host_bundle), "--query", "q"))
    assert "the query is empty" in _error(cli("run", str(reranker_host_bundle), "--query", "  ", "--document", "d"))
    assert "not several" in _error(cli("run", str(reranker_host_bundle), "--query", "q", "--text", "t"))


@slow
def test_too_many_documents_and_a_bundle_without_task_are_refused(reranker_host_bundle):  # noqa: F811
    bundle = Bundle.open(reranker_host_bundle)
    with pytest.raises(InputError, match="3 documents is more than 2 per call"):
        scoring.pair_feeds(bundle, "q", ["d"] * 3, limit=2)
    bundle.manifest.task = None  # the same bundle read as an embedding bundle
    with pytest.raises(InputError, match="not a reranker or classifier"):
        scoring.task_of(bundle)


@slow
def test_the_library_call_scores_through_a_session(reranker_host_bundle):  # noqa: F811
    from edgeinfer.run.bundle import open_session

    rr = Bundle.open(reranker_host_bundle)
    with open_session(rr) as s:
        got = scoring.rerank(rr, s, QUERY, DOCS)
        with pytest.raises(InputError, match="is a reranker, not a classifier"):
            scoring.classify(rr, s, ["a text"])
    want = 1 / (1 + np.exp(-direct_logits(reranker_host_bundle, [(QUERY, d) for d in DOCS])[:, 0]))
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-4)


@slow
def test_bench_times_pairs_through_the_scores(reranker_host_bundle):  # noqa: F811
    report = _json(cli("bench", str(reranker_host_bundle), "--batch", "1", "--repeat", "1", "--json"))
    assert (report["task"], report["unit"]) == ("rerank", "pairs")
    assert [r["batch"] for r in report["results"]] == [1]
    assert all(r["throughput_per_s"] > 0 for r in report["results"])


# --- the scoring rules, no model ---------------------------------------------------------------------------


def test_activations_and_ranking():
    x = np.array([[-800.0, 0.0, 2.0]])
    assert scoring.activate(x, "sigmoid")[0].tolist() == pytest.approx([0.0, 0.5, 1 / (1 + math.exp(-2))])
    e = [0.0, 1.0, math.exp(2.0)]
    assert scoring.activate(x, "softmax")[0].tolist() == pytest.approx([v / sum(e) for v in e])
    assert scoring.activate(x, "none").tolist() == x.tolist()
    assert scoring.ranked(np.array([0.2, 0.9, 0.2, 0.5]), top_n=3) == [(1, 0.9), (3, 0.5), (0, 0.2)]


def test_a_manifest_that_disagrees_with_the_logits_fails_in_one_line():
    with pytest.raises(ModelError, match="one logit per pair; this model gives 3"):
        scoring.relevance(TaskSpec(kind="rerank", activation="sigmoid"), np.zeros((2, 3)))
    with pytest.raises(ModelError, match="names 2 labels but the model gives 3"):
        scoring.labelled(TaskSpec(kind="classify", labels=["a", "b"]), np.zeros((1, 3)))
    unnamed = scoring.labelled(TaskSpec(kind="classify", activation="softmax"), np.array([[0.0, 1.0]]))
    assert unnamed[0]["label"] == "LABEL_1"
