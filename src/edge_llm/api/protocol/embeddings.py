"""The /v1/embeddings body and answer (OpenAI's shapes). Errors use the server's one error envelope."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, StrictInt, StrictStr

from edge_llm.api.protocol.common import RequestModel

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
MAX_REQUEST_TOKENS = 32768  # all inputs together: about two minutes of work on a small CPU


class EmbeddingsRequest(RequestModel):
    # A string, strings, one text as token ids, or texts as token ids (OpenAI's four forms).
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the little-endian float32 bytes


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
