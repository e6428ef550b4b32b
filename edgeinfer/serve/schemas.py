"""Request and response schemas of the HTTP API (they make the OpenAPI document). Pydantic only: the
request-preparation processes import this module without Starlette."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

#: request models take JSON's types as they are (no "4" for 4, no 1 for true; a float field takes an
#: integer, as JSON does not tell them apart), and refuse fields they do not know
STRICT = ConfigDict(strict=True, extra="forbid")
MAX_NAME = 256  # a model id, a user id: characters
MAX_METADATA = 16  # OpenAI's bounds on ``metadata``: 16 pairs, keys of 64 and values of 512 characters


def one_or_list(value: Any) -> Any:
    """A bare string is a list of one (OpenAI's ``str | list[str]`` fields); the list is then validated
    alone, so an error names the item that is wrong instead of every branch of a union."""
    return [value] if isinstance(value, str) else [] if value is None else value


def str_or_list(max_items: int, max_chars: int | None = None, min_chars: int = 0, description: str = "") -> Any:
    """A ``str | list[str]`` field of at most ``max_items`` strings of ``min_chars`` to ``max_chars``."""
    item: dict[str, Any] = {"type": "string", **({"minLength": min_chars} if min_chars else {}),
                            **({"maxLength": max_chars} if max_chars else {})}
    doc = {"anyOf": [item, {"type": "array", "items": item, "maxItems": max_items}], "description": description}
    text = Annotated[str, Field(min_length=min_chars, max_length=max_chars)]
    return Annotated[list[text], BeforeValidator(one_or_list), Field(max_length=max_items), WithJsonSchema(doc)]


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=MAX_METADATA)]
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's bound; --max-inputs (default 256) is usually the tighter one


class EmbeddingRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = STRICT
    input: str_or_list(MAX_EMBEDDING_INPUTS, description="A string or a list of strings to embed.")  # type: ignore
    model: Name | None = Field(
        None, description="Model id from /v1/models (optional when one embedding model is served).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Must equal the model's dimension when given.")
    user: Name | None = Field(None, description="The end user's id: accepted, not used.")


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class RerankDocument(BaseModel):
    """A document as an object (Cohere's v1 rerank API); only ``text`` is read, other fields are kept out."""

    model_config = ConfigDict(strict=True, extra="ignore")
    text: str


DOCUMENTS_SCHEMA = {"type": "array", "maxItems": MAX_EMBEDDING_INPUTS,
                    "description": "Strings, or objects with a 'text' field (Cohere v1).",
                    "items": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["text"],
                                                             "properties": {"text": {"type": "string"}}}]}}


class RerankRequest(BaseModel):
    """The rerank request of Cohere (https://docs.cohere.com/reference/rerank) and Jina
    (https://jina.ai/reranker/): the documents scored against the query, best first."""

    model_config = STRICT
    query: str = Field(min_length=1, description="The text the documents are ranked against.")
    documents: Annotated[list[Union[str, RerankDocument]], Field(max_length=MAX_EMBEDDING_INPUTS),
                         WithJsonSchema(DOCUMENTS_SCHEMA)]
    model: Name | None = Field(None, description="Model id from /v1/models (optional when one reranker is served).")
    top_n: int | None = Field(None, ge=1, description="Return only the best N results (default: all).")
    return_documents: bool = Field(False, description="Echo each document back as {'text': ...} in its result.")


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ClassifyRequest(BaseModel):
    """vLLM's classification request (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html),
    as SGLang also serves it: a label per input text."""

    model_config = STRICT
    input: str_or_list(MAX_EMBEDDING_INPUTS, description="A string or a list of strings to classify.")  # type: ignore
    model: Name | None = Field(
        None, description="Model id from /v1/models (optional when one classifier is served).")
    user: Name | None = Field(None, description="The end user's id: accepted, not used.")


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: Usage


class InferRequest(BaseModel):
    """Named input tensors as (nested) JSON arrays; axis 0 is the batch. Dtypes follow the model's specs."""

    model_config = STRICT
    inputs: dict[Name, Any] = Field(max_length=256, description="Input name → nested JSON array (axis 0 is the "
                                                                  "batch).")
    model: Name | None = Field(None, description="Model id from /v1/models (optional when one model is served).")
    id: str | None = Field(None, max_length=200, description="Echoed back in the response.")


class Tensor(BaseModel):
    dtype: str
    shape: list[int]
    data: Any


class InferResponse(BaseModel):
    id: str
    model: str
    outputs: dict[str, Tensor]


class ErrorBody(BaseModel):
    message: str
    type: str
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody

