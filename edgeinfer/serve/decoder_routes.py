"""OpenAI-compatible text generation: ``POST /v1/chat/completions`` and ``POST /v1/completions``,
streamed as server-sent events in OpenAI's chunk format (``data: [DONE]`` last) or answered whole.

Request and response shapes follow OpenAI's API reference
(https://platform.openai.com/docs/api-reference/chat/create and /completions/create), with strict JSON
types (``"4"`` is not 4) and bounds on every list and string. Supported fields: ``messages`` (content a
string or a list of text parts) / ``prompt``, ``max_tokens`` (``max_completion_tokens``), ``temperature``
(default 1 as in OpenAI's API; 0 is greedy), ``top_p``, ``seed`` (0..2**64-1), ``stop`` (up to 4),
``n`` (1 only), ``stream``, ``stream_options.include_usage``, ``logprobs`` / ``top_logprobs`` (step
decoders only: a native-loop backend has no logits to give), and vLLM's ``ignore_eos``, ``top_k`` and
``repetition_penalty``. Accepted and not used: ``user``, ``metadata``, ``store``. OpenAI fields that are
not implemented (``decoder_schemas.NOT_IMPLEMENTED``: tools, response_format, logit_bias, penalties, audio, ...)
are 400 naming the field unless their value asks for nothing; any other unknown field is 400.
docs/serve.md lists them for users.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from edgeinfer.serve.decoder_engine import Engine, QueueFull, ServedDecoder
from edgeinfer.serve.decoder_engine import Request as GenRequest
from edgeinfer.serve.decoder_schemas import ChatRequest, CompletionRequest
from edgeinfer.serve.generation_prep import prepare_generation
from edgeinfer.serve.prep import OFFLOAD_BYTES, ApiError

if TYPE_CHECKING:
    from edgeinfer.serve.api import Api


def add_routes(api: Api, engines: dict[str, Engine], timeout_s: float, accepting: Any, observe: Any,
               prepare: Any = None, elsewhere: dict[str, str] | None = None) -> None:
    """The two generation endpoints over ``engines`` (model id → engine); ``accepting``, ``prepare`` and
    ``elsewhere`` as in :func:`respond`."""

    async def generate(request: Request, chat: bool) -> Any:
        arrived = time.perf_counter()
        return await respond(engines, await request.body(), request.headers.get("content-type", ""), chat,
                             timeout_s, accepting, observe, arrived, prepare, elsewhere)

    @api.post("/v1/chat/completions", tag="generation", body=ChatRequest, errors=True)
    async def chat_completions(request: Request) -> Any:
        """Chat completion (OpenAI-compatible), streamed with ``"stream": true``."""
        return await generate(request, chat=True)

    @api.post("/v1/completions", tag="generation", body=CompletionRequest, errors=True)
    async def completions(request: Request) -> Any:
        """Text completion of a prompt (OpenAI-compatible), streamed with ``"stream": true``."""
        return await generate(request, chat=False)


async def _inline(heavy: bool, fn: Any, *args: Any, decoders: dict[str, ServedDecoder],
                  threaded: bool = False) -> Any:
    return await asyncio.to_thread(fn, decoders, *args) if threaded else fn(decoders, *args)


async def respond(engines: dict[str, Engine], raw: bytes, content_type: str, chat: bool, timeout_s: float,
                  accepting: Any, observe: Any, arrived: float | None = None, prepare: Any = None,
                  elsewhere: dict[str, str] | None = None) -> Any:
    """The answer to one chat / completion request body: a streamed or a whole response; ApiError for a
    request that cannot be served. ``accepting(model)`` is None when that decoder takes requests now, else
    the ApiError to answer; ``prepare(heavy, fn, *args, threaded=...)`` runs ``fn(decoders, *args)`` (a heavy
    one in a helper process, a threaded one on a thread: :meth:`Offload.prepare`; default inline or on a
    thread). The single-box routes and the Ray replicas (edgeinfer/fleet) share it."""
    arrived = time.perf_counter() if arrived is None else arrived
    if prepare is None:
        prepare = functools.partial(_inline, decoders={n: e.llm for n, e in engines.items()})
    # a chat template comes with the model (untrusted, bounded but possibly slow): never on the event loop, but
    # on a thread (its Python steps give the loop the GIL every switch interval), a large body in a helper
    p = await prepare(len(raw) > OFFLOAD_BYTES, prepare_generation, raw, content_type, chat, elsewhere,
                      threaded=chat)
    eng = engines[p.model]
    refusal = accepting(p.model)
    if refusal is not None:
        raise refusal
    check_logprobs(eng, p.logprobs)
    req = GenRequest(p.ids, p.options, arrived=arrived)
    try:
        eng.submit(req)
    except QueueFull:
        raise ApiError(429, f"all {eng.slots} sequence slots are busy and {eng.max_queue} requests wait; "
                            "retry shortly", {"Retry-After": "1"}) from None
    except RuntimeError as e:
        raise ApiError(503, str(e)) from None
    observe("prompt", model=eng.llm.name, tokens=len(req.prompt_ids))
    meta = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], "created": int(time.time()),
            "model": eng.llm.name}
    events = _events(eng, req, time.monotonic() + timeout_s, observe)
    lp = Logprobs(chat) if p.logprobs is not None else None
    if p.stream:
        return StreamingResponse(_sse(events, meta, chat, p.usage, len(req.prompt_ids), lp),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _whole(events, meta, chat, len(req.prompt_ids), lp)


def check_logprobs(eng: Engine, wanted: int | None) -> None:
    """A native loop never shows its logits (known once its worker is up): 400 naming the backend."""
    if wanted is not None and eng.info.get("native_loop"):
        raise ApiError(400, f"logprobs: the {eng.llm.backend} backend of {eng.llm.name} runs its own generation "
                            "loop and does not expose logprobs; remove 'logprobs'")


TIMEOUT = "timeout: the generation did not end within the per-request timeout"
_TIMED_OUT = ("", 0, "error", TIMEOUT)  # put in a request's queue by its deadline timer


async def _events(eng: Engine, req: GenRequest, deadline: float, observe: Any) -> AsyncIterator[tuple]:
    """``(text, tokens, finish, error, logprobs)`` per worker event of ``req`` (``logprobs``: the entries of
    its tokens, when asked for), with the request's metrics; cancels the sequence when the consumer goes
    away (client disconnect) or the deadline passes. One timer per request puts the timeout in the queue:
    no ``wait_for`` (a task and a timer) per token."""
    name, first, last, tokens, finish = eng.llm.name, None, None, 0, None
    timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), req.events.put_nowait,
                                                  _TIMED_OUT)
    try:
        while True:
            item = await req.events.get()
            text, n, finish, error = item
            while finish is None and not req.events.empty():  # a slow reader gets what piled up at once
                item = req.events.get_nowait()
                if item is _TIMED_OUT:
                    break
                more, m, finish, error = item
                text, n = text + more, n + m
            if n:
                now = time.perf_counter()
                if first is None:
                    first = now
                    observe("ttft", model=name, seconds=now - req.arrived)
                last, tokens = now, tokens + n
                if item is _TIMED_OUT:  # the text that came before the deadline, then the timeout
                    yield text, n, None, None, req.logprobs[tokens - n : tokens]
            if item is _TIMED_OUT:
                finish, error = _TIMED_OUT[2:]
                yield "", 0, finish, error, []
                return
            yield text, n, finish, error, req.logprobs[tokens - n : tokens]
            if finish is not None:
                return
    finally:
        timer.cancel()
        if finish is None or (finish == "error" and req.state != "done"):
            eng.cancel(req)
        observe("generated", model=name, tokens=tokens)
        if finish in ("stop", "length"):
            observe("e2e", model=name, seconds=time.perf_counter() - req.arrived)
            if first is not None and last is not None and tokens > 1:
                observe("tpot", model=name, seconds=(last - first) / (tokens - 1))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Logprobs:
    """The worker's per-token entries in OpenAI's shapes: chat ``{"content": [{token, logprob, bytes,
    top_logprobs}], "refusal": null}``; completions ``{tokens, token_logprobs, top_logprobs, text_offset}``
    (offsets count characters of the completion's tokens from 0, across the chunks of a stream)."""

    def __init__(self, chat: bool):
        self.chat, self.offset = chat, 0

    def block(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        if self.chat:
            return {"content": entries, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(e["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}


def _choice(chat: bool, text: str | None, finish: str | None, delta: bool, first: bool = False,
            logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    if delta:
        d: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else (
            {"content": text} if text or logprobs else {})
        return {"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish}


def _error_body(message: str) -> dict[str, Any]:
    status = 504 if message.startswith("timeout") else 500
    return {"error": {"message": message, "type": "timeout" if status == 504 else "server_error", "code": status}}


def _cut_off(tokens: int) -> dict[str, Any]:
    """A sequence the server cancelled while a client still reads it (SIGTERM, after the drain period): an
    error, never a ``finish_reason`` a client would take for a complete answer."""
    return {"error": {"message": f"the server is shutting down and cut this answer off after {tokens} tokens; "
                                 "it is incomplete: retry the request", "type": "service_unavailable", "code": 503}}


async def _whole(events: AsyncIterator[tuple], meta: dict[str, Any], chat: bool, prompt: int,
                 lp: Logprobs | None = None) -> JSONResponse:
    parts, count, finish, entries = [], 0, "stop", []
    try:
        async for text, n, fin, error, logprobs in events:
            if error is not None or fin == "cancelled":
                body = _error_body(error) if error is not None else _cut_off(count + n)
                return JSONResponse(body, status_code=body["error"]["code"])
            parts.append(text)
            entries += logprobs
            count += n
            finish = fin if fin in ("stop", "length") else finish
    finally:
        await events.aclose()  # a timed-out sequence is cancelled (its slot freed) now, not when collected
    obj = "chat.completion" if chat else "text_completion"
    choice = _choice(chat, "".join(parts), finish, False, logprobs=lp.block(entries) if lp else None)
    return JSONResponse({**meta, "object": obj, "choices": [choice], "usage": _usage(prompt, count),
                         "system_fingerprint": None})


_PIECE = "\0"  # a text no model emits as a whole piece: its JSON string occurs once in a chunk


async def _sse(events: AsyncIterator[tuple], meta: dict[str, Any], chat: bool, usage: bool,
               prompt: int, lp: Logprobs | None = None) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**meta, "object": obj, "choices": choices, **extra}).encode() + b"\n\n"

    # the chunk of a text piece, the per-token one, as bytes around the piece's JSON string (the same bytes)
    before, after = chunk([_choice(chat, _PIECE, None, True)]).split(json.dumps(_PIECE).encode())
    count = 0
    try:
        if chat:
            yield chunk([_choice(chat, "", None, True, first=True)])
        async for text, n, finish, error, logprobs in events:
            if error is not None:
                yield b"data: " + json.dumps(_error_body(error)).encode() + b"\n\n"
                break
            count += n
            if text and not lp:
                yield before + json.dumps(text).encode() + after
            elif text or (lp and logprobs):
                yield chunk([_choice(chat, text, None, True, logprobs=lp.block(logprobs) if lp else None)])
            if finish == "cancelled":  # cut off by the shutdown: an error event (the openai client raises it)
                yield b"data: " + json.dumps(_cut_off(count)).encode() + b"\n\n"
                break
            if finish is not None:
                yield chunk([_choice(chat, "", finish, True)])
        if usage:
            yield chunk([], usage=_usage(prompt, count))
        yield b"data: [DONE]\n\n"
    finally:
        await events.aclose()  # a client that went away cancels its sequence now
