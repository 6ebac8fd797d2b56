"""What /v1/responses answers: the Response object, its output items, usage, and the numbered events of a stream.

Each shape is a TypedDict built by one function (`api/serving/responses_events.py`'s ResponseBuilder decides when
each is sent); tests/unit/test_wire_shapes.py validates every event against the openai SDK's
`ResponseStreamEvent`, and benchmarks/chunk_cost.py measures the per-delta cost.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from edge_llm.api.protocol.llama_server_answers import PromptProgress, Timings
from edge_llm.engine.types import Usage

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


def response_usage(usage: Usage) -> ResponseUsage:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


def text_part(text: str) -> OutputText:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class MessageItem(TypedDict):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallItem(TypedDict):
    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


OutputItem = MessageItem | FunctionCallItem


def message_item(item_id: str, status: ItemStatus, content: list[OutputText]) -> MessageItem:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, status: ItemStatus, call_id: str, name: str, arguments: str
                       ) -> FunctionCallItem:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


ResponseErrorCode = Literal["server_error", "rate_limit_exceeded", "invalid_prompt"]


class ResponseError(TypedDict):
    code: ResponseErrorCode  # one of the codes the SDK's ResponseError knows
    message: str


def response_error(message: str, status: int = 500) -> ResponseError:
    """The `error` of a failed response. OpenAI types its code as one of a closed list, so the server's own code
    (kept in the HTTP error's envelope) maps by status: a refused request is `invalid_prompt`, a 429
    `rate_limit_exceeded`, any other `server_error`."""
    code: ResponseErrorCode = ("invalid_prompt" if 400 <= status < 500 and status != 429 else
                               "rate_limit_exceeded" if status == 429 else "server_error")
    return {"code": code, "message": message}


class IncompleteDetails(TypedDict):
    reason: str


class Response(TypedDict):
    """The Response object; the request's echoed fields (`ResponsesRequest.echo`) follow these keys."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Status
    completed_at: int | None
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None
    previous_response_id: str | None
    reasoning: None
    truncation: Literal["disabled"]
    background: bool


def response(response_id: str, created_at: int, status: Status, model: str, output: list[OutputItem], *,
             completed_at: int | None, usage: ResponseUsage | None, error: ResponseError | None,
             incomplete_reason: str | None, echo: dict[str, Any]) -> Response:
    body: Response = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": completed_at,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "model": model,
        "output": output,
        "usage": usage,
        "previous_response_id": None,
        "reasoning": None,
        "truncation": "disabled",
        "background": False,
    }
    body.update(echo)  # type: ignore[typeddict-item]  # the request's settings, as OpenAI echoes them
    return body


# ---- stream events (each numbered by `sequence_number`) --------------------------------------------


class ResponseEvent(TypedDict):
    """response.created, .in_progress, .completed, .incomplete, .failed; llama-server's telemetry keys beside
    OpenAI's: `prompt_progress` on .in_progress (`return_progress`), `timings` on the end."""

    type: str
    sequence_number: int
    response: Response
    prompt_progress: NotRequired[PromptProgress]
    timings: NotRequired[Timings]


class OutputItemEvent(TypedDict):
    """response.output_item.added, .done"""

    type: str
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(TypedDict):
    """response.content_part.added, .done"""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class TextDeltaEvent(TypedDict):
    type: Literal["response.output_text.delta"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]
    timings: NotRequired[Timings]  # llama-server's `timings_per_token`


class TextDoneEvent(TypedDict):
    type: Literal["response.output_text.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ArgumentsEvent(TypedDict):
    """response.function_call_arguments.delta (`delta`), .done (`arguments`)"""

    type: str
    sequence_number: int
    item_id: str
    output_index: int
    delta: NotRequired[str]
    arguments: NotRequired[str]
    timings: NotRequired[Timings]  # llama-server's `timings_per_token`


Event = ResponseEvent | OutputItemEvent | ContentPartEvent | TextDeltaEvent | TextDoneEvent | ArgumentsEvent


def response_event(kind: Literal["created", "in_progress", "completed", "incomplete", "failed"], sequence: int,
                   snapshot: Response) -> ResponseEvent:
    return {"type": f"response.{kind}", "sequence_number": sequence, "response": snapshot}


def output_item_event(kind: Literal["added", "done"], sequence: int, output_index: int, item: OutputItem
                      ) -> OutputItemEvent:
    return {"type": f"response.output_item.{kind}", "sequence_number": sequence, "output_index": output_index,
            "item": item}


def content_part_event(kind: Literal["added", "done"], sequence: int, item_id: str, output_index: int,
                       part: OutputText) -> ContentPartEvent:
    return {"type": f"response.content_part.{kind}", "sequence_number": sequence, "item_id": item_id,
            "output_index": output_index, "content_index": 0, "part": part}


def text_delta_event(sequence: int, item_id: str, output_index: int, delta: str) -> TextDeltaEvent:
    return {"type": "response.output_text.delta", "sequence_number": sequence, "item_id": item_id,
            "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []}


def text_done_event(sequence: int, item_id: str, output_index: int, text: str) -> TextDoneEvent:
    return {"type": "response.output_text.done", "sequence_number": sequence, "item_id": item_id,
            "output_index": output_index, "content_index": 0, "text": text, "logprobs": []}


def arguments_delta_event(sequence: int, item_id: str, output_index: int, delta: str) -> ArgumentsEvent:
    return {"type": "response.function_call_arguments.delta", "sequence_number": sequence, "item_id": item_id,
            "output_index": output_index, "delta": delta}


def arguments_done_event(sequence: int, item_id: str, output_index: int, arguments: str) -> ArgumentsEvent:
    return {"type": "response.function_call_arguments.done", "sequence_number": sequence, "item_id": item_id,
            "output_index": output_index, "arguments": arguments}


# ---- stored responses (GET /v1/responses/{id}/input_items, DELETE /v1/responses/{id}) ----------------------------


class ItemList(TypedDict):
    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Deleted(TypedDict):
    id: str
    object: Literal["response"]
    deleted: bool


def item_list(page: list[dict[str, Any]], has_more: bool) -> ItemList:
    """OpenAI's `ResponseItemList`: one page of stored input items."""
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": has_more}


def deleted(response_id: str) -> Deleted:
    """What DELETE answers (the SDK returns nothing; OpenAI's API sends this)."""
    return {"id": response_id, "object": "response", "deleted": True}
