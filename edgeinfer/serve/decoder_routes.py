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
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import EdgeInferError
from edgeinfer.run.generation.stopping import ContextExceeded, context_room
from edgeinfer.serve.decoder_engine import Engine, QueueFull, ServedDecoder
from edgeinfer.serve.decoder_engine import Request as GenRequest
from edgeinfer.serve.decoder_schemas import ChatRequest, CompletionRequest, body_doc
from edgeinfer.serve.prep import OFFLOAD_BYTES, ApiError, elsewhere_error, read_json, validated
from edgeinfer.serve.schemas import ERRORS


def add_routes(app: FastAPI, engines: dict[str, Engine], timeout_s: float, accepting: Any, observe: Any,
               prepare: Any = None, elsewhere: dict[str, str] | None = None) -> None:
    """The two generation endpoints over ``engines`` (model id → engine); ``accepting``, ``prepare`` and
    ``elsewhere`` as in :func:`respond`."""

    async def generate(request: Request, chat: bool) -> Any:
        arrived = time.perf_counter()
        return await respond(engines, await request.body(), request.headers.get("content-type", ""), chat,
                             timeout_s, accepting, observe, arrived, prepare, elsewhere)

    @app.post("/v1/chat/completions", tags=["generation"], responses=ERRORS, openapi_extra=body_doc(ChatRequest))
    async def chat_completions(request: Request):
        """Chat completion (OpenAI-compatible), streamed with ``"stream": true``."""
        return await generate(request, chat=True)

    @app.post("/v1/completions", tags=["generation"], responses=ERRORS,
              openapi_extra=body_doc(CompletionRequest))
    async def completions(request: Request):
        """Text completion of a prompt (OpenAI-compatible), streamed with ``"stream": true``."""
        return await generate(request, chat=False)


def engine_for(engines: dict[str, Any], model: str | None, endpoint: str = "",
               elsewhere: dict[str, str] | None = None) -> Any:
    """The served decoder ``model`` names (``engines``: name → engine or ServedDecoder)."""
    if model is not None:
        if model not in engines:
            other = elsewhere_error(model, endpoint, elsewhere)
            if other is not None:
                raise other
            raise ApiError(404, f"The model '{model}' does not exist; GET /v1/models lists the served ones")
        return engines[model]
    if len(engines) == 1:
        return next(iter(engines.values()))
    raise ApiError(400, f"several decoders are served; name one in 'model' ({', '.join(engines)})")


@dataclass
class PreparedPrompt:
    """A generation request read, checked and tokenized (in a helper process when the server has them)."""

    model: str
    ids: list[int]
    options: GenerationOptions  # validated here once; the worker takes it as it is
    stream: bool
    usage: bool

    @property
    def logprobs(self) -> int | None:
        return self.options.logprobs


def prepare_generation(decoders: dict[str, ServedDecoder], raw: bytes, content_type: str, chat: bool,
                       elsewhere: dict[str, str] | None = None) -> PreparedPrompt:
    """Parse and check a chat / completion body, render the chat template and tokenize: CPU work that
    :class:`~edgeinfer.serve.prep.Offload` runs off the event loop."""
    body = validated(ChatRequest if chat else CompletionRequest, read_json(raw, content_type))
    llm = engine_for(decoders, body.model, "/v1/chat/completions" if chat else "/v1/completions", elsewhere)
    ids, options = prompt_and_options(llm, body, chat)
    return PreparedPrompt(llm.name, ids, options, body.stream,
                          bool(body.stream_options and body.stream_options.include_usage))


async def _inline(heavy: bool, fn: Any, *args: Any, decoders: dict[str, ServedDecoder]) -> Any:
    return fn(decoders, *args)


async def respond(engines: dict[str, Engine], raw: bytes, content_type: str, chat: bool, timeout_s: float,
                  accepting: Any, observe: Any, arrived: float | None = None, prepare: Any = None,
                  elsewhere: dict[str, str] | None = None) -> Any:
    """The answer to one chat / completion request body: a streamed or a whole response; ApiError for a
    request that cannot be served. ``accepting(model)`` is None when that decoder takes requests now, else
    the ApiError to answer; ``prepare(heavy, fn, *args)`` runs ``fn(decoders, *args)`` (off the event loop:
    :meth:`Offload.prepare`; default inline). The single-box routes and the Ray replicas (edgeinfer/fleet)
    share it."""
    arrived = time.perf_counter() if arrived is None else arrived
    if prepare is None:
        prepare = functools.partial(_inline, decoders={n: e.llm for n, e in engines.items()})
    # a chat template comes with the model (untrusted, bounded but possibly slow): never on the event loop
    p = await prepare(chat or len(raw) > OFFLOAD_BYTES, prepare_generation, raw, content_type, chat, elsewhere)
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


# Normalizers may shorten text a little (NFKC composes characters): the cheap bound allows twice the most
# characters the longest vocabulary entry can stand for
CHARS_SLACK = 2


def check_length_cheaply(llm: ServedDecoder, chars: int) -> int:
    """A prompt of more characters than the context can hold even in the vocabulary's longest tokens
    cannot fit: refused before the chat template and the tokenizer spend time on it. Returns the bound."""
    limit = llm.context * max(1, llm.codec.longest_token) * CHARS_SLACK
    if chars > limit:
        raise ApiError(400, f"This model's maximum context length is {llm.context} tokens: the prompt has "
                            f"{chars} characters, more than that many tokens can hold (at most {limit}); "
                            "shorten the prompt")
    return limit


def prompt_and_options(llm: ServedDecoder, body: Any, chat: bool) -> tuple[list[int], GenerationOptions]:
    """The prompt's token ids and the generation options; 400 on what the model cannot do."""
    if body.n not in (None, 1):
        raise ApiError(400, f"n={body.n}: this server generates one choice per request; send n=1 (or omit it)")
    codec = llm.codec
    try:
        if chat:
            limit = check_length_cheaply(llm, sum(len(m.content) for m in body.messages))
            ids = codec.encode_chat([m.model_dump(exclude_none=True) for m in body.messages], max_chars=limit)
        else:
            prompt = body.prompt[0]
            check_length_cheaply(llm, len(prompt))
            ids = codec.encode(prompt)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line()) from None
    if not ids:
        raise ApiError(400, "the prompt is empty; give some text to continue")
    wanted = body.max_tokens or body.max_completion_tokens
    try:
        max_new_tokens = context_room(len(ids), llm.context, wanted)
    except ContextExceeded as e:  # in OpenAI's words
        fix = f"ask for at most {e.room} max_tokens" if e.room > 0 else "shorten the prompt"
        raise ApiError(400, f"This model's maximum context length is {e.context} tokens: the prompt has {e.prompt} "
                            f"and max_tokens is {wanted if wanted is not None else 'at least 1'}; {fix}") from None
    try:
        options = GenerationOptions(
            max_new_tokens=max_new_tokens, temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed, stop=tuple(body.stop),
            ignore_eos=body.ignore_eos, top_k=body.top_k or 0, logprobs=body.logprobs_wanted(),
            repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty)
    except EdgeInferError as e:
        raise ApiError(400, e.one_line()) from None
    return ids, options


async def _events(eng: Engine, req: GenRequest, deadline: float, observe: Any) -> AsyncIterator[tuple]:
    """``(text, tokens, finish, error, logprobs)`` per worker event of ``req`` (``logprobs``: the entries of
    its tokens, when asked for), with the request's metrics; cancels the sequence when the consumer goes
    away (client disconnect) or the deadline passes."""
    name, first, last, tokens, finish = eng.llm.name, None, None, 0, None
    try:
        while True:
            try:
                left = max(0.0, deadline - time.monotonic())
                text, n, finish, error = await asyncio.wait_for(req.events.get(), left)
                while finish is None and not req.events.empty():  # a slow reader gets what piled up at once
                    more, m, finish, error = req.events.get_nowait()
                    text, n = text + more, n + m
            except asyncio.TimeoutError:
                finish, error = "error", "timeout: the generation did not end within the per-request timeout"
                yield "", 0, finish, error, []
                return
            if n:
                now = time.perf_counter()
                if first is None:
                    first = now
                    observe("ttft", model=name, seconds=now - req.arrived)
                last, tokens = now, tokens + n
            yield text, n, finish, error, req.logprobs[tokens - n : tokens]
            if finish is not None:
                return
    finally:
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


async def _sse(events: AsyncIterator[tuple], meta: dict[str, Any], chat: bool, usage: bool,
               prompt: int, lp: Logprobs | None = None) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**meta, "object": obj, "choices": choices, **extra}).encode() + b"\n\n"

    count = 0
    try:
        if chat:
            yield chunk([_choice(chat, "", None, True, first=True)])
        async for text, n, finish, error, logprobs in events:
            if error is not None:
                yield b"data: " + json.dumps(_error_body(error)).encode() + b"\n\n"
                break
            count += n
            if text or (lp and logprobs):
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
