"""Request and response schemas of the HTTP API (they make the OpenAPI document). Pydantic only: the
request-preparation processes import this module without FastAPI."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingRequest(BaseModel):
    """OpenAI-compatible embeddings request."""

    model_config = ConfigDict(extra="ignore")
    input: Union[str, list[str]] = Field(description="A string or a list of strings to embed.")
    model: str | None = Field(
        None, description="Model id from /v1/models (optional when one embedding model is served).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="Must equal the model's dimension when given.")
    user: str | None = None


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


class InferRequest(BaseModel):
    """Named input tensors as (nested) JSON arrays; axis 0 is the batch. Dtypes follow the model's specs."""

    model_config = ConfigDict(extra="forbid")
    inputs: dict[str, Any] = Field(description="Input name → nested JSON array (axis 0 is the batch).")
    model: str | None = Field(None, description="Model id from /v1/models (optional when one model is served).")
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


ERRORS = {c: {"model": ErrorResponse} for c in (400, 401, 404, 413, 429, 500, 503, 504)}


def request_body(schema: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body the endpoint reads itself (off the event loop)."""
    content = {"application/json": {"schema": schema.model_json_schema()}}
    return {"requestBody": {"required": True, "content": content}}
