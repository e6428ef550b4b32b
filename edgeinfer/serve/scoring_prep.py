"""``/v1/rerank`` and ``/v1/classify``: requests read into feeds for the batcher (kind ``"score"``: the
workers answer logits per row) and logits encoded back as the answer, with the same checks, limits and
errors as embeddings (:mod:`edgeinfer.serve.prep`). Scores come from :mod:`edgeinfer.run.scoring`, as
``edgeinfer run`` makes them."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from edgeinfer.errors import EdgeInferError
from edgeinfer.run import scoring
from edgeinfer.serve.prep import (
    ApiError,
    Models,
    Prepared,
    ServedModel,
    check_finite,
    dumps,
    elsewhere_error,
    read_json,
    validated,
)
from edgeinfer.serve.schemas import ClassifyRequest, RerankRequest

if TYPE_CHECKING:
    import numpy as np

NAMES = {"rerank": "reranker", "classify": "classifier"}


def pick_scorer(models: Models, model: str | None, task: str, elsewhere: dict[str, str] | None) -> ServedModel:
    """The served model of ``task`` that a request names, or the only one; 400/404 naming where to go."""
    endpoint = f"/v1/{task}"
    if model is not None:
        m = models.get(model)
        if m is None:
            raise elsewhere_error(model, endpoint, elsewhere) or ApiError(
                404, f"unknown model {model!r}; GET /v1/models lists: {', '.join(models)}")
        if m.task != task:
            served = " and ".join(m.to_json(0)["endpoints"])
            raise ApiError(400, f"model {model!r} is not a {NAMES[task]}: it is served on {served}; send the "
                                "request there")
        return m
    cands = [m for m in models.values() if m.task == task]
    if len(cands) == 1:
        return cands[0]
    if not cands:
        raise ApiError(400, f"no {NAMES[task]} is served (GET /v1/models lists what is)")
    names = ", ".join(m.name for m in cands)
    raise ApiError(400, f"several {NAMES[task]}s are served; name one in 'model' ({names})")


def _tokens(feeds: dict[str, np.ndarray]) -> int:
    mask = feeds.get("attention_mask")
    return int(mask.sum()) if mask is not None else 0


def _too_many(what: str, n: int, max_inputs: int) -> ApiError | None:
    if n > max_inputs:
        return ApiError(400, f"{what}: at most {max_inputs} per request (--max-inputs), got {n}")
    return None


def prepare_rerank(models: Models, body: bytes, content_type: str, max_inputs: int,
                   elsewhere: dict[str, str] | None = None) -> Prepared:
    req = validated(RerankRequest, read_json(body, content_type))
    m = pick_scorer(models, req.model, "rerank", elsewhere)
    docs = [d if isinstance(d, str) else d.text for d in req.documents]
    if not docs:
        raise ApiError(400, "documents: give at least one document")
    if (err := _too_many("documents", len(docs), max_inputs)) is not None:
        raise err
    try:
        feeds = scoring.pair_feeds(m.bundle, req.query, docs)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line()) from None
    answer = {"task": m.bundle.manifest.task, "top_n": req.top_n, "documents": docs if req.return_documents else None}
    return Prepared(m.name, "score", feeds, len(docs), ("score",), tokens=_tokens(feeds), answer=answer)


def prepare_classify(models: Models, body: bytes, content_type: str, max_inputs: int,
                     elsewhere: dict[str, str] | None = None) -> Prepared:
    req = validated(ClassifyRequest, read_json(body, content_type))
    m = pick_scorer(models, req.model, "classify", elsewhere)
    texts = list(req.input)
    if not texts:
        raise ApiError(400, "input: give at least one string")
    if (err := _too_many("input", len(texts), max_inputs)) is not None:
        raise err
    try:
        feeds = scoring.text_feeds(m.bundle, texts)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line()) from None
    return Prepared(m.name, "score", feeds, len(texts), ("score",), tokens=_tokens(feeds),
                    answer={"task": m.bundle.manifest.task})


def _scores(p: Prepared, logits: np.ndarray, read_out):
    """``read_out(task, logits)`` for a checked batch; a manifest that disagrees with the logits is a 500."""
    check_finite(p.model, {"logits": logits})
    try:
        return read_out(p.answer["task"], logits)
    except EdgeInferError as e:
        raise ApiError(500, e.one_line()) from None


def encode_rerank(p: Prepared, logits: np.ndarray) -> bytes:
    scores = _scores(p, logits, scoring.relevance)
    docs = p.answer["documents"]
    results = [{"index": i, "relevance_score": s, **({"document": {"text": docs[i]}} if docs is not None else {})}
               for i, s in scoring.ranked(scores, p.answer["top_n"])]
    return dumps({"id": uuid.uuid4().hex, "model": p.model, "results": results,
                  "usage": {"total_tokens": p.tokens}})


def encode_classify(p: Prepared, logits: np.ndarray) -> bytes:
    rows = _scores(p, logits, scoring.labelled)
    data = [{"index": i, "label": r["label"], "probs": [s["score"] for s in r["scores"]],
             "num_classes": len(r["scores"])} for i, r in enumerate(rows)]
    return dumps({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                  "model": p.model, "data": data, "usage": {"prompt_tokens": p.tokens, "total_tokens": p.tokens}})
