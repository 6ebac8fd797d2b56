"""What Ollama's /api/chat and /api/generate answer: one object per streamed piece (NDJSON lines), the last one with
`done: true` and Ollama's figures (durations in nanoseconds), or one object for the whole answer.

Each shape is a TypedDict built by one function (api/serving/ollama_stream.py decides what goes in them);
tests/unit/test_wire_shapes.py validates them against the ollama package's ChatResponse and GenerateResponse.
"""

from __future__ import annotations

import time
from typing import Any, Literal, NotRequired, TypedDict


def created_at() -> str:
    """Now, as Go writes a UTC time in JSON (RFC 3339 with nanoseconds, trailing zeros dropped, "Z")."""
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{nanoseconds:09d}".rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


class ToolCallFunction(TypedDict):
    index: int
    name: str
    arguments: dict[str, Any]


class ToolCall(TypedDict):
    id: str
    function: ToolCallFunction


def tool_call(call_id: str, index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": arguments}}


class AssistantMessage(TypedDict):
    role: Literal["assistant"]
    content: str
    tool_calls: NotRequired[list[ToolCall]]


class Figures(TypedDict):
    """What the last object of an answer adds."""

    done_reason: str
    context: NotRequired[list[int]]  # /api/generate's, when it has one
    total_duration: int
    load_duration: int
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int


class ChatLine(TypedDict):
    model: str
    created_at: str
    message: AssistantMessage
    done: bool
    logprobs: NotRequired[list[dict[str, Any]]]  # OpenAI's chat logprob entries, as Ollama sends them


class GenerateLine(TypedDict):
    model: str
    created_at: str
    response: str
    done: bool
    logprobs: NotRequired[list[dict[str, Any]]]


def chat_line(model: str, text: str, tool_calls: list[ToolCall], done: bool,
              logprobs: list[dict[str, Any]] | None = None) -> ChatLine:
    message: AssistantMessage = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    line: ChatLine = {"model": model, "created_at": created_at(), "message": message, "done": done}
    if logprobs:
        line["logprobs"] = logprobs
    return line


def generate_line(model: str, text: str, done: bool, logprobs: list[dict[str, Any]] | None = None) -> GenerateLine:
    line: GenerateLine = {"model": model, "created_at": created_at(), "response": text, "done": done}
    if logprobs:
        line["logprobs"] = logprobs
    return line


def figures(reason: str, *, context: list[int] | None, total_ns: int, load_ns: int, prompt_tokens: int,
            prompt_ns: int, output_tokens: int, output_ns: int) -> Figures:
    out: Figures = {"done_reason": reason}  # type: ignore[typeddict-item]  # the rest follows, in Ollama's order
    if context is not None:
        out["context"] = context
    out.update(total_duration=total_ns, load_duration=load_ns, prompt_eval_count=prompt_tokens,
               prompt_eval_duration=prompt_ns, eval_count=output_tokens, eval_duration=output_ns)
    return out


class DoneAnswer(TypedDict):
    """The answer of a request that only loaded (`load`) or unloaded (`unload`) its model."""

    model: str
    created_at: str
    message: NotRequired[AssistantMessage]
    response: NotRequired[str]
    done: Literal[True]
    done_reason: Literal["load", "unload"]


def done_answer(model: str, *, chat: bool, reason: Literal["load", "unload"]) -> DoneAnswer:
    answer: DoneAnswer = {"model": model, "created_at": created_at()}  # type: ignore[typeddict-item]
    if chat:
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    answer.update(done=True, done_reason=reason)
    return answer


class EmbedAnswer(TypedDict):
    """/api/embed's answer; the figures only when something was embedded."""

    model: str
    embeddings: list[list[float]]
    total_duration: NotRequired[int]
    load_duration: NotRequired[int]
    prompt_eval_count: NotRequired[int]


def embed_answer(model: str, embeddings: list[list[float]], *, total_ns: int | None = None, load_ns: int = 0,
                 prompt_tokens: int = 0) -> EmbedAnswer:
    answer: EmbedAnswer = {"model": model, "embeddings": embeddings}
    if total_ns is not None:
        answer.update(total_duration=total_ns, load_duration=load_ns, prompt_eval_count=prompt_tokens)
    return answer


class EmbeddingAnswer(TypedDict):
    """/api/embeddings' (the older route's) answer: one vector, empty for an empty prompt."""

    embedding: list[float]


def embedding_answer(vector: list[float]) -> EmbeddingAnswer:
    return {"embedding": vector}
