"""The /v1/embeddings body and answer (OpenAI's shapes). Errors use the server's one error envelope.

The answer models document the route (OpenAPI); the body sent is built by `embedding_list` as plain dicts (2,048
vectors of ~900 floats validated one by one would hold up the event loop), checked against the SDK's
`CreateEmbeddingResponse` in tests/unit/test_wire_shapes.py."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, Field, field_validator

from edge_llm.api.protocol.common import RequestModel, unreadable
from edge_llm.api.protocol.llama_server import is_token_id, one_or_several

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
MAX_REQUEST_TOKENS = 32768  # all inputs together: about two minutes of work on a small CPU


Input = list[int | str]  # one input: text pieces and token ids, in order (one string: a list of one piece)
_SHAPES = ("a string, token ids, token ids and strings mixed, an object with 'prompt_string' or with 'content' "
           "text parts, or a list of these")


class EmbeddingsRequest(RequestModel):
    # OpenAI's four forms (a string, strings, one text as token ids, texts as token ids) and llama-server's
    # (token ids and text mixed, {"prompt_string": …}, {"content": [text parts]}): read into `inputs`.
    input: Any = Field(description="a string, a list of strings, token ids, or a list of token-id lists")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _inputs(cls, value: Any) -> list[Input]:
        return embedding_inputs(value)

    @property
    def inputs(self) -> list[Input]:
        return self.input  # type: ignore[no-any-return]  # embedding_inputs made it a list of inputs


def embedding_inputs(value: Any) -> list[Input]:
    """llama-server's reading of `input` (handle_embeddings_impl, as one_or_several); an empty text is refused later,
    naming its input."""
    return [_one_input(item, where) for item, where in one_or_several(value, limit=MAX_INPUTS, noun="input")]


def _one_input(item: Any, where: str) -> Input:
    if isinstance(item, dict):
        if "content" in item:
            return [_content_text(item["content"], where)]
        if item.get("multimodal_data") is not None:
            raise unreadable(f"{where}multimodal_data")
        item = item.get("prompt_string")
    if isinstance(item, str):
        return [item]
    if isinstance(item, list) and all(is_token_id(piece) or isinstance(piece, str) for piece in item):
        return list(item)
    raise ValueError(f"{where}each input must be {_SHAPES.removesuffix(', or a list of these')}")


def _content_text(parts: Any, where: str) -> str:
    """llama-server's OpenAI-style content parts: their texts joined; other media cannot be read here."""
    if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
        raise ValueError(f"{where}'content' must be a list of content parts")
    texts = []
    for part in parts:
        kind = part.get("type")
        if kind in ("image_url", "input_audio", "input_video", "image", "audio", "video", "file"):
            raise unreadable(f"{where}content parts of type '{kind}'")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}content parts must be {{'type': 'text', 'text': …}} (got type {kind!r})")
        texts.append(part["text"])
    return "".join(texts)


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
