"""Reading a chat / completion request: parse and check the body, render the chat template, tokenize, and
the generation options. Kept apart from the routes (``decoder_routes``) so the request helpers that run it
(``serve.prep.Offload``, spawned processes) do not import FastAPI (~18 MiB of RSS each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeinfer.contract.generation import GenerationOptions
from edgeinfer.errors import EdgeInferError
from edgeinfer.run.generation.stopping import ContextExceeded, context_room
from edgeinfer.serve.decoder_engine import ServedDecoder
from edgeinfer.serve.decoder_schemas import ChatRequest, CompletionRequest
from edgeinfer.serve.prep import ApiError, elsewhere_error, read_json, validated


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
