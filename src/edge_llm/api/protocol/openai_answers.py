"""What the OpenAI routes answer: completions, chat completions and their stream chunks, usage, logprobs and timings.

The pydantic models (`ChatCompletion`, `Completion`) document the routes (OpenAPI); what is sent is built by one
function per shape, as TypedDicts: the whole answers (`chat_completion`, `text_completion` and their choices), the
stream chunks written once per token (`chat_chunk`, `completion_chunk`, `usage_chunk`: a dict literal costs a
fraction of a model's dump on the hot path, benchmarks/chunk_cost.py) and the two logprobs shapes.
tests/unit/test_wire_shapes.py checks every encoder against the official SDK's types, so the wire cannot drift
from here.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, Field

from edge_llm.api.protocol.openai_chat import ToolCall
from edge_llm.engine.types import TokenLogprob


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
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None  # only when the answer calls tools


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


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


# ---- the whole answers (what is sent) ------------------------------------------------------------


class ChatMessageAnswer(TypedDict):
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: NotRequired[list[dict[str, Any]]]


class ChatChoiceAnswer(TypedDict):
    index: int
    message: ChatMessageAnswer
    logprobs: dict[str, Any] | None
    finish_reason: str


class CompletionChoiceAnswer(TypedDict):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str


class ChatCompletionAnswer(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoiceAnswer]
    usage: dict[str, Any]
    system_fingerprint: None
    timings: dict[str, float]  # where the request's time went (not OpenAI's)


class TextCompletionAnswer(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoiceAnswer]
    usage: dict[str, Any]
    system_fingerprint: None
    timings: dict[str, float]


def chat_choice(index: int, content: str | None, tool_calls: list[dict[str, Any]], finish_reason: str,
                logprobs: dict[str, Any] | None = None) -> ChatChoiceAnswer:
    """One choice of a chat answer; `tool_calls` (OpenAI's shape) only when it called tools."""
    message: ChatMessageAnswer = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_choice(index: int, text: str, finish_reason: str, logprobs: dict[str, Any] | None = None
                      ) -> CompletionChoiceAnswer:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_completion(completion_id: str, model: str, choices: list[ChatChoiceAnswer], usage: dict[str, Any],
                    timings: dict[str, float]) -> ChatCompletionAnswer:
    """A non-streamed chat answer: its choices, the usage of the whole request and the extra `timings`."""
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None, "timings": timings}


def text_completion(completion_id: str, model: str, choices: list[CompletionChoiceAnswer], usage: dict[str, Any],
                    timings: dict[str, float]) -> TextCompletionAnswer:
    """A non-streamed legacy completion, laid out as `chat_completion`."""
    return {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage, "system_fingerprint": None, "timings": timings}


class SimpleDone(TypedDict):
    """The `done` event that ends the simple body's plain-text stream (the server's own shape, not OpenAI's)."""

    finish_reason: str
    usage: dict[str, Any]
    timings: dict[str, float]


def simple_done(finish_reason: str, usage: dict[str, Any], timings: dict[str, float]) -> SimpleDone:
    return {"finish_reason": finish_reason, "usage": usage, "timings": timings}


# ---- logprobs ----------------------------------------------------------------------------------


def piece_text(piece: bytes) -> str:
    """A token's bytes as text (a piece that splits a UTF-8 character shows U+FFFD)."""
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}."""
    return {
        "content": [
            {
                "token": piece_text(entry.piece),
                "logprob": entry.logprob,
                "bytes": list(entry.piece),
                "top_logprobs": [
                    {"token": piece_text(piece), "logprob": logprob, "bytes": list(piece)}
                    for _, piece, logprob in entry.top
                ],
            }
            for entry in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict[str, Any]:
    """The legacy completions shape: parallel lists of tokens, logprobs, top maps and text offsets."""
    offsets: list[int] = []
    position = text_offset
    for entry in entries:
        offsets.append(position)
        position += len(piece_text(entry.piece))
    return {
        "tokens": [piece_text(entry.piece) for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{piece_text(piece): logprob for _, piece, logprob in entry.top} for entry in entries],
        "text_offset": offsets,
    }


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
