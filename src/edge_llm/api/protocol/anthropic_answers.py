"""What /v1/messages answers: the Message object, its content blocks, stop_reason, usage, and the SSE events of a
streamed answer.

Each shape is a TypedDict built by one function: the events go out once per token, where a dict literal costs a
fraction of a pydantic dump (benchmarks/chunk_cost.py); tests/unit/test_wire_shapes.py validates every one against
the anthropic SDK's own types. The pydantic models at the end are the OpenAPI document's.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, TypedDict

from pydantic import BaseModel

from edge_llm.engine.types import FinishReason, Finished

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A parsed call's JSON arguments as tool_use `input`, which must be an object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def stop_reason(finished: Finished, tool_calls: bool) -> StopReason:
    """Anthropic's stop_reason for how the engine ended an answer."""
    if tool_calls:
        return "tool_use"
    if finished.reason is FinishReason.STOP and finished.stop_sequence is not None:
        return "stop_sequence"
    if finished.reason is FinishReason.LENGTH:
        return "max_tokens"
    # STOP: an end token; TIMEOUT (--request-timeout) ends the turn with the text so far.
    return "end_turn"


class AnthropicUsage(TypedDict):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> AnthropicUsage:
    """Anthropic counts input tokens read from the cache apart from the others (their sum is the prompt)."""
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


# ---- content blocks and the Message ---------------------------------------------------------------


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ToolUseBlock


def text_block(text: str) -> TextBlock:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, arguments: str) -> ToolUseBlock:
    return {"type": "tool_use", "id": tool_use_id(call_id), "name": name, "input": tool_input(arguments)}


class Message(TypedDict):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    content: list[ContentBlock]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage


def message(message_id: str, model: str, content: list[ContentBlock], reason: StopReason | None,
            stop_sequence: str | None, answer_usage: AnthropicUsage) -> Message:
    return {"id": message_id, "type": "message", "role": "assistant", "content": content, "model": model,
            "stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            "usage": answer_usage}


# ---- stream events --------------------------------------------------------------------------------


class MessageStartEvent(TypedDict):
    type: Literal["message_start"]
    message: Message


class PingEvent(TypedDict):
    type: Literal["ping"]


class ContentBlockStartEvent(TypedDict):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentBlock


class TextDelta(TypedDict):
    type: Literal["text_delta"]
    text: str


class InputJsonDelta(TypedDict):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDeltaEvent(TypedDict):
    type: Literal["content_block_delta"]
    index: int
    delta: TextDelta | InputJsonDelta


class ContentBlockStopEvent(TypedDict):
    type: Literal["content_block_stop"]
    index: int


class StopDelta(TypedDict):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDeltaEvent(TypedDict):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: AnthropicUsage


class MessageStopEvent(TypedDict):
    type: Literal["message_stop"]


StreamEvent = (MessageStartEvent | PingEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent
               | MessageDeltaEvent | MessageStopEvent)


def message_start(opening: Message) -> MessageStartEvent:
    return {"type": "message_start", "message": opening}


def ping() -> PingEvent:
    return {"type": "ping"}


def block_start(index: int, block: ContentBlock) -> ContentBlockStartEvent:
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_delta(index: int, text: str) -> ContentBlockDeltaEvent:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def input_json_delta(index: int, partial_json: str) -> ContentBlockDeltaEvent:
    return {"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": partial_json}}


def block_stop(index: int) -> ContentBlockStopEvent:
    return {"type": "content_block_stop", "index": index}


def message_delta(reason: StopReason, stop_sequence: str | None, answer_usage: AnthropicUsage) -> MessageDeltaEvent:
    return {"type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None},
            "usage": answer_usage}


def message_stop() -> MessageStopEvent:
    return {"type": "message_stop"}


# ---- for the OpenAPI document ---------------------------------------------------------------------


class MessageResponse(BaseModel):
    """The non-streamed answer (for the OpenAPI document; built by `message`)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]]
    model: str
    stop_reason: StopReason
    stop_sequence: str | None = None
    usage: dict[str, int]


class TokenCount(TypedDict):
    input_tokens: int


def token_count(prompt_tokens: int) -> TokenCount:
    """/v1/messages/count_tokens' answer (the SDK's `MessageTokensCount`)."""
    return {"input_tokens": prompt_tokens}


class CountTokensResponse(BaseModel):
    input_tokens: int
