"""The OpenAI chat / completions request models (strict JSON types, a bound on every list and string) and the
fields this server refuses. Pydantic only: the request-preparation processes import it without Starlette.
edgeinfer/serve/decoder_routes.py documents what is supported; docs/serve.md lists it for users."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from edgeinfer.contract.generation import MAX_SEED, MAX_TOP_LOGPROBS
from edgeinfer.serve.schemas import STRICT, Metadata, Name, str_or_list

MAX_STOP, MAX_STOP_CHARS = 4, 256  # OpenAI allows 4 stop sequences
MAX_MESSAGES = 2048  # OpenAI's bound on a chat's messages
MAX_PARTS = 256  # text parts of one message's content
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on the legacy completions' ``logprobs``

#: OpenAI fields this server does not implement, with the values that ask for nothing (accepted, so that
#: clients sending their defaults work); any other value is a 400 naming the field
NOT_IMPLEMENTED: dict[str, tuple[str, Any]] = {
    "tools": ("tool calling", lambda v: v in (None, [])),
    "tool_choice": ("tool calling", lambda v: v in (None, "none", "auto")),
    "parallel_tool_calls": ("tool calling", lambda v: v is None or isinstance(v, bool)),
    "functions": ("function calling", lambda v: v in (None, [])),
    "function_call": ("function calling", lambda v: v in (None, "none", "auto")),
    "response_format": ("structured output", lambda v: v in (None, {"type": "text"})),
    "logit_bias": ("logit_bias", lambda v: v in (None, {})),
    "frequency_penalty": ("frequency_penalty (see repetition_penalty)", lambda v: v in (None, 0)),
    "presence_penalty": ("presence_penalty (see repetition_penalty)", lambda v: v in (None, 0)),
    "audio": ("audio output", lambda v: v is None),
    "modalities": ("output modalities other than text", lambda v: v in (None, ["text"])),
    "prediction": ("predicted outputs", lambda v: v is None),
    "reasoning_effort": ("reasoning_effort", lambda v: v is None),
    "web_search_options": ("web search", lambda v: v is None),
    "best_of": ("best_of", lambda v: v in (None, 1)),
    "echo": ("echo", lambda v: v in (None, False)),
    "suffix": ("suffix (insertion)", lambda v: v in (None, "")),
}


def refuse_unimplemented(data: Any) -> Any:
    """Drop the unimplemented fields that ask for nothing; 400 (naming the field) for those that do."""
    if not isinstance(data, dict):
        return data
    for key, (what, neutral) in NOT_IMPLEMENTED.items():
        if key in data:
            if not neutral(data[key]):
                raise PydanticCustomError("not_implemented", "{field}: this server does not implement {what}; "
                                          "remove the field", {"field": key, "what": what})
            data = {k: v for k, v in data.items() if k != key}
    return data


def message_text(value: Any) -> Any:
    """A message's ``content`` as one string: a list of text parts is joined with newlines (as vLLM does);
    other parts (images, audio, files) are refused."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_PARTS:
        raise PydanticCustomError("too_long", "give at most {n} content parts", {"n": MAX_PARTS})
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise PydanticCustomError(
                "content_part", "part {i} is not a text part (an object with type 'text' and a 'text' string); "
                "this server takes text only", {"i": i})
        texts.append(part["text"])
    return "\n".join(texts)


def seed_in_range(value: int) -> int:
    if not 0 <= value <= MAX_SEED:
        raise PydanticCustomError("seed_range", "give an integer from 0 to {top} (2**64 - 1), the range every "
                                  "backend takes", {"top": MAX_SEED})
    return value


_TEXT_PART = {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
              "required": ["type", "text"], "additionalProperties": False}
Content = Annotated[str, BeforeValidator(message_text), WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "maxItems": MAX_PARTS}],
     "description": "Text, or a list of text parts (joined with newlines)."})]


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False


class _Sampling(BaseModel):
    model_config = STRICT

    @model_validator(mode="before")
    @classmethod
    def unimplemented_fields(cls, data: Any) -> Any:
        return refuse_unimplemented(data)

    model: Name | None = Field(None, description="Model id from /v1/models (optional when one decoder is served).")
    max_tokens: int | None = Field(None, ge=1, description="Tokens to generate at most (default: up to the context).")
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="Sample from the k most likely tokens; 0: all (vLLM's).")
    repetition_penalty: float | None = Field(None, gt=0, le=100, description="> 1 discourages repeats (vLLM's).")
    seed: Annotated[int, AfterValidator(seed_in_range)] | None = Field(
        None, description=f"0 to {MAX_SEED} (2**64 - 1): the range every backend takes.",
        json_schema_extra={"minimum": 0, "maximum": MAX_SEED})
    stop: str_or_list(MAX_STOP, MAX_STOP_CHARS, 1, f"Up to {MAX_STOP} strings of up to {MAX_STOP_CHARS} "  # type: ignore
                      "characters; the text ends before the first.") = Field(default_factory=list)
    n: int | None = Field(1, ge=1, description="Choices to generate: 1 only.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="Keep generating past EOS (vLLM's extension; for benchmarks).")
    user: Name | None = Field(None, description="The end user's id: accepted, not used.")
    metadata: Metadata | None = Field(None, description="Accepted, not used (nothing is stored).")
    store: bool | None = Field(None, description="Accepted, not used (nothing is stored).")


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "developer"]
    content: Content
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None, description="The participant's name, given to the chat template.")


class ChatRequest(_Sampling):
    """OpenAI-compatible chat completion request."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    logprobs: bool | None = Field(False, description="Return each token's log-probability (step-primitive backends).")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS,
                                     description="With logprobs: the most likely tokens at each position.")

    @model_validator(mode="after")
    def top_logprobs_needs_logprobs(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise PydanticCustomError("top_logprobs", "top_logprobs: set logprobs to true to use it")
        return self

    def logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    """OpenAI-compatible (legacy) completion request: one prompt string."""

    prompt: str_or_list(1, description="One prompt string (a list of one is taken too).")  # type: ignore
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS,
                                 description="Return each token's log-probability and this many most likely "
                                             "tokens (step-primitive backends).")

    def logprobs_wanted(self) -> int | None:
        return self.logprobs

