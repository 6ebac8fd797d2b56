"""The /v1/embeddings body and answer (OpenAI's shapes). Errors use the server's one error envelope.

The answer models document the route (OpenAPI); the body sent is built by `embedding_list` as plain dicts (2,048
vectors of ~900 floats validated one by one would hold up the event loop), checked against the SDK's
`CreateEmbeddingResponse` in tests/unit/test_wire_shapes.py."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

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


class EmbeddingAnswer(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingListAnswer(TypedDict):
    object: Literal["list"]
    data: list[EmbeddingAnswer]
    model: str
    usage: dict[str, int]


def embedding_list(vectors: list[Any], model: str, prompt_tokens: int) -> EmbeddingListAnswer:
    """OpenAI's list of embeddings: `vectors` already encoded (floats or base64), in input order."""
    data: list[EmbeddingAnswer] = [{"object": "embedding", "index": i, "embedding": vector}
                                   for i, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
