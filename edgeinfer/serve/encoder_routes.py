"""Encoder inference: ``POST /v1/embeddings`` (OpenAI-compatible), ``POST /v1/rerank`` (Cohere / Jina),
``POST /v1/classify`` (vLLM's) and ``POST /v1/infer`` (named tensors).

A request's body is read, checked and tokenized (in a helper process when it is large), queued in the
:class:`~edgeinfer.serve.batcher.Batcher`, merged with others into a batch that a worker process runs
(:class:`~edgeinfer.serve.workers.WorkerPool`), and its share of the outputs encoded back to JSON.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

from starlette.requests import Request
from starlette.responses import Response

from edgeinfer.serve.batcher import Batcher, Item, QueueFull, RequestFailed
from edgeinfer.serve.prep import (
    OFFLOAD_BYTES,
    OFFLOAD_VALUES,
    ApiError,
    Offload,
    Prepared,
    encode_embeddings,
    encode_infer,
    prepare_embeddings,
    prepare_infer,
)
from edgeinfer.serve.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    InferRequest,
    InferResponse,
    RerankRequest,
    RerankResponse,
)
from edgeinfer.serve.scoring_prep import encode_classify, encode_rerank, prepare_classify, prepare_rerank

if TYPE_CHECKING:
    from edgeinfer.serve.api import Api
    from edgeinfer.serve.app import State
    from edgeinfer.serve.config import ServeConfig


def add_routes(api: Api, batcher: Batcher, offload: Offload, config: ServeConfig, state: State,
               starting: Callable[[], ApiError], endpoints: dict[str, str],
               observe: Callable[..., None] = lambda *a, **k: None) -> None:
    """The encoder endpoints over ``batcher`` (and its worker pool); ``offload`` prepares and encodes
    large bodies off the event loop; ``state`` says whether the server is ready or failed; ``starting()`` is
    the 503 while models still load; ``endpoints`` (model → its endpoints) names where another model is
    served; ``observe`` counts each answered request per model (metrics)."""
    pool = batcher.pool

    def timed_out() -> ApiError:
        return ApiError(504, f"no answer within {config.timeout_s:g} s (server busy); retry or raise --timeout-s")

    async def read(request: Request, fn: Any, deadline: float) -> Prepared:
        """Parse, check and tokenize the body: in a helper process when it is large (off the event loop)."""
        if not state.ready and not pool.ready() and not state.fatal:
            raise starting()
        body = await request.body()
        ctype = request.headers.get("content-type", "")
        work = offload.prepare(len(body) > OFFLOAD_BYTES, fn, body, ctype, config.max_inputs, endpoints)
        try:  # past the deadline, a helper's result is dropped
            return await asyncio.wait_for(work, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise timed_out() from None

    async def submit(p: Prepared, deadline: float) -> dict:
        if state.fatal:
            raise ApiError(503, f"the models could not be loaded: {state.fatal}")
        item = Item(p.model, p.kind, p.feeds, p.rows, p.key, asyncio.get_running_loop().create_future())
        try:
            batcher.submit(item)
        except QueueFull:
            raise ApiError(429, f"the queue is full ({config.max_queue} requests waiting); retry shortly",
                           {"Retry-After": "1"}) from None
        try:
            return await asyncio.wait_for(asyncio.shield(item.future), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            batcher.cancel(item)  # dropped from the queue, or its batch stopped when nobody else waits for it
            raise timed_out() from None
        except RequestFailed as e:
            raise ApiError(e.status, e.message) from None

    def answer(data: bytes, p: Prepared | None = None, endpoint: str = "") -> Response:
        if p is not None:
            observe("model_request", model=p.model, endpoint=endpoint)
        return Response(data, media_type="application/json")

    async def scored(request: Request, prepare, encode, endpoint: str) -> Response:
        """A reranker's or classifier's request: its logits from the batcher, turned into the endpoint's answer."""
        deadline = time.monotonic() + config.timeout_s
        p = await read(request, prepare, deadline)
        logits = (await submit(p, deadline))["logits"]
        return answer(encode(p, logits), p, endpoint)

    @api.post("/v1/embeddings", tag="inference", body=EmbeddingRequest, response=EmbeddingResponse, errors=True)
    async def embeddings(request: Request) -> Response:
        """Embed one string or a list of strings (OpenAI-compatible)."""
        deadline = time.monotonic() + config.timeout_s
        p = await read(request, prepare_embeddings, deadline)
        vecs = (await submit(p, deadline))["embedding"]
        return answer(await offload.encode(vecs.size > OFFLOAD_VALUES, encode_embeddings, p, vecs), p,
                      "/v1/embeddings")

    @api.post("/v1/rerank", tag="inference", body=RerankRequest, response=RerankResponse, errors=True)
    @api.post("/v2/rerank", tag="inference", body=RerankRequest, response=RerankResponse, errors=True)
    async def rerank(request: Request) -> Response:
        """Score documents against a query with a reranker (cross-encoder); results best first (Cohere / Jina
        rerank API; /v2/rerank is where Cohere's current client posts)."""
        return await scored(request, prepare_rerank, encode_rerank, request.url.path)

    @api.post("/v1/classify", tag="inference", body=ClassifyRequest, response=ClassifyResponse, errors=True)
    async def classify(request: Request) -> Response:
        """Label one string or a list of strings with a classifier (vLLM's classification API)."""
        return await scored(request, prepare_classify, encode_classify, "/v1/classify")

    @api.post("/v1/infer", tag="inference", body=InferRequest, response=InferResponse, errors=True)
    async def infer(request: Request) -> Response:
        """Run named tensors (axis 0 is the batch; requests are merged along it)."""
        deadline = time.monotonic() + config.timeout_s
        p = await read(request, prepare_infer, deadline)
        out = await submit(p, deadline)
        rid = p.id or request.headers.get("x-request-id") or uuid.uuid4().hex
        size = sum(v.size for v in out.values())
        return answer(await offload.encode(size > OFFLOAD_VALUES, encode_infer, rid, p.model, out), p, "/v1/infer")
