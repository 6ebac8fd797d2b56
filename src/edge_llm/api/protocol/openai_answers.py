"""What the OpenAI routes answer: completions, chat completions and their stream chunks, usage and timings.

The whole answers are pydantic models (the OpenAPI document's); the stream chunks, written once per token, are
TypedDicts built by one function each (`chat_chunk`, `completion_chunk`, `usage_chunk`): a dict literal costs a
fraction of a model's dump on the hot path (benchmarks/chunk_cost.py), and tests/unit/test_wire_shapes.py checks
every encoder against the official SDK's types, so the wire cannot drift from here.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, Field

from edge_llm.api.protocol.openai_chat import ToolCall


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class Timings(BaseModel):
    """Extra field `timings` (not in OpenAI's schema): where the request's time went, in milliseconds."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    timings: Timings | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    timings: Timings | None = None


# ---- stream chunks -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamHead:
    """What every chunk of one stream repeats: its id, creation time and model."""

    id: str
    created: int
    model: str


class ChatDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    tool_calls: list[dict[str, Any]]


class ChatChunkChoice(TypedDict):
    index: int
    delta: ChatDelta
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    timings: NotRequired[dict[str, float]]  # the last chunk of a choice: where its time went (not OpenAI's)


class CompletionChunkChoice(TypedDict):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class CompletionChunk(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    timings: NotRequired[dict[str, float]]


class UsageChunk(TypedDict):
    """The chunk `stream_options.include_usage` asks for: no choices, the usage of the whole request."""

    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    choices: list[Any]
    usage: dict[str, Any]


def chat_chunk(head: StreamHead, index: int, delta: ChatDelta, finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None, timings: dict[str, float] | None = None
               ) -> ChatCompletionChunk:
    # OpenAI's chunks keep explicit nulls (logprobs, finish_reason).
    chunk: ChatCompletionChunk = {
        "id": head.id, "object": "chat.completion.chunk", "created": head.created, "model": head.model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if timings is not None:
        chunk["timings"] = timings
    return chunk


def completion_chunk(head: StreamHead, index: int, text: str, finish_reason: str | None = None,
                     logprobs: dict[str, Any] | None = None, timings: dict[str, float] | None = None
                     ) -> CompletionChunk:
    chunk: CompletionChunk = {
        "id": head.id, "object": "text_completion", "created": head.created, "model": head.model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if timings is not None:
        chunk["timings"] = timings
    return chunk


def usage_chunk(head: StreamHead, kind: Literal["chat.completion.chunk", "text_completion"], usage: dict[str, Any]
                ) -> UsageChunk:
    return {"id": head.id, "object": kind, "created": head.created, "model": head.model, "choices": [],
            "usage": usage}
