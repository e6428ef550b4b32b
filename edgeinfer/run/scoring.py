"""Rerankers and classifiers: a text bundle whose manifest has a ``task`` section
(:class:`~edgeinfer.model.bundle.TaskSpec`) scores texts instead of embedding them.

A reranker (cross-encoder) reads each (query, document) pair as one sequence pair and gives one logit per
pair, as Hugging Face text-embeddings-inference treats a one-label ``*ForSequenceClassification`` model; a
classifier gives one logit per label. ``task.activation`` turns logits into the scores a user sees. The
functions here are shared by ``edgeinfer run`` / ``bench`` and ``serve`` (``/v1/rerank``, ``/v1/classify``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeinfer.errors import InputError, ModelError
from edgeinfer.run import bundle as run_bundle

if TYPE_CHECKING:
    import numpy as np

    from edgeinfer.contract.backend import Session
    from edgeinfer.model.bundle import Bundle, TaskSpec

#: documents one rerank call takes, as Cohere's rerank API bounds a request
#: (https://docs.cohere.com/v2/docs/reranking-best-practices); serve's --max-inputs is usually tighter
MAX_DOCUMENTS = 10_000


def task_of(bundle: Bundle, want: str | None = None) -> TaskSpec:
    """The bundle's task section (of kind ``want`` when given); InputError when it has none or another."""
    task = bundle.manifest.task
    if task is None:
        raise InputError(f"bundle {bundle.path} is not a reranker or classifier (its manifest has no task section); "
                         "run it with --text for embeddings, or deploy a *ForSequenceClassification model")
    if want is not None and task.kind != want:
        use = "--query and --document" if task.kind == "rerank" else "--text"
        raise InputError(f"bundle {bundle.path} is a {_NAMES[task.kind]}, not a {_NAMES[want]}; give it {use}")
    if bundle.manifest.text is None:
        raise ModelError(f"bundle {bundle.path} has a task section but no tokenizer (text section); deploy it again")
    return task


_NAMES = {"rerank": "reranker", "classify": "classifier"}


def pair_feeds(bundle: Bundle, query: str, documents: list[str], limit: int = MAX_DOCUMENTS) -> dict[str, np.ndarray]:
    """Feeds for (query, document) pairs: each pair one sequence pair, truncated to the bundle's length."""
    if not query.strip():
        raise InputError("the query is empty; give the text the documents are ranked against")
    if not documents:
        raise InputError("no documents to rerank; give at least one")
    if len(documents) > limit:
        raise InputError(f"{len(documents)} documents is more than {limit} per call; split them into several calls")
    return run_bundle.tokenize_texts(bundle, [(query, d) for d in documents])


def text_feeds(bundle: Bundle, texts: list[str], limit: int = MAX_DOCUMENTS) -> dict[str, np.ndarray]:
    if not texts:
        raise InputError("no texts to classify; give at least one")
    if len(texts) > limit:
        raise InputError(f"{len(texts)} texts is more than {limit} per call; split them into several calls")
    return run_bundle.tokenize_texts(bundle, texts)


def logits(bundle: Bundle, outputs: dict[str, np.ndarray]) -> np.ndarray:
    """The ``[rows, labels]`` logits among a run's outputs (the text section's output)."""
    import numpy as np

    out = np.asarray(outputs[bundle.manifest.text.output], dtype=np.float32)
    return out.reshape(len(out), -1)


def activate(values: np.ndarray, activation: str) -> np.ndarray:
    """Logits → scores: sigmoid per logit, softmax over each row's labels, or unchanged."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    if activation == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * x))  # the logistic function, without exp overflow warnings
    if activation == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return x


def relevance(task: TaskSpec, row_logits: np.ndarray) -> np.ndarray:
    """One relevance score per pair from a reranker's ``[pairs, 1]`` logits."""
    if row_logits.shape[1] != 1:
        raise ModelError(f"a reranker gives one logit per pair; this model gives {row_logits.shape[1]} "
                         "(a classifier? its manifest's task.kind should be 'classify')")
    return activate(row_logits[:, 0], task.activation)


def labelled(task: TaskSpec, row_logits: np.ndarray) -> list[dict[str, Any]]:
    """Per text: the best label, its score and every label's score (labels in logit order)."""
    import numpy as np

    n = row_logits.shape[1]
    labels = task.labels or [f"LABEL_{i}" for i in range(n)]
    if len(labels) != n:
        raise ModelError(f"the manifest names {len(labels)} labels but the model gives {n} logits; deploy it again")
    scores = activate(row_logits, task.activation)
    out = []
    for row in scores:
        best = int(np.argmax(row))
        out.append({"label": labels[best], "score": float(row[best]),
                    "scores": [{"label": lb, "score": float(s)} for lb, s in zip(labels, row)]})
    return out


def ranked(scores: np.ndarray, top_n: int | None = None) -> list[tuple[int, float]]:
    """(index, score) best first (ties keep input order), at most ``top_n``."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    return [(i, float(scores[i])) for i in order[:top_n]]


def run_feeds(bundle: Bundle, session: Session, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The logits of ``feeds`` through ``session``: static batches padded, bucketed bundles trimmed to the
    longest row first (a bucket adds back only the padding its shape needs), as ``run`` does for embeddings."""
    from edgeinfer.run.padding import run_padded

    if bundle.manifest.buckets:
        from edgeinfer.run.buckets import trim

        feeds = trim(feeds)
    return logits(bundle, run_padded(session, feeds))


def rerank(bundle: Bundle, session: Session, query: str, documents: list[str]) -> np.ndarray:
    """A relevance score per document for ``query``, in the documents' order."""
    task = task_of(bundle, "rerank")
    return relevance(task, run_feeds(bundle, session, pair_feeds(bundle, query, documents)))


def classify(bundle: Bundle, session: Session, texts: list[str]) -> list[dict[str, Any]]:
    """Per text: its label, the label's score and every label's score."""
    task = task_of(bundle, "classify")
    return labelled(task, run_feeds(bundle, session, text_feeds(bundle, texts)))
