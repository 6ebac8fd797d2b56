"""Which output items and events a Responses answer makes, in order (their shapes: api/protocol/responses_answers.py).

One `ResponseBuilder` follows an answer as it comes (text deltas, tool calls, the end) and returns the events a
stream sends, numbered by `sequence_number`; a non-streamed answer runs the same builder and keeps only the final
Response, so both carry the same items. Pure: no engine, no I/O (tests/unit/test_responses.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from edge_llm.api.protocol.llama_server_answers import PromptProgress
from edge_llm.api.protocol.responses_answers import (
    Event,
    MessageItem,
    OutputItem,
    Response,
    ResponseError,
    Status,
    arguments_delta_event,
    arguments_done_event,
    content_part_event,
    function_call_item,
    message_item,
    output_item_event,
    response as response_object,
    response_error,
    response_event,
    response_usage,
    text_delta_event,
    text_done_event,
    text_part,
)
from edge_llm.engine.types import Usage
from edge_llm.prompting.tools import ParsedToolCall


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """The output items of one answer and the events that announce them.

    Whitespace before the first visible character is held back, so an answer that is only a tool call (the
    template often puts a newline first) gets no empty message item; an answer with no items at all ends with
    one message item holding whatever text there was.
    """

    def __init__(self, model: str, settings: dict[str, Any]) -> None:
        self.response_id = new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.settings = settings  # the request's echoed fields (ResponsesRequest.echo)
        self.output: list[OutputItem] = []
        self._sequence = 0
        self._message: MessageItem | None = None
        self._text: list[str] = []
        self._held = ""

    def _next(self) -> int:
        """The next event's sequence_number."""
        self._sequence += 1
        return self._sequence - 1

    def response(self, status: Status, usage: Usage | None = None, *, error: ResponseError | None = None,
                 incomplete_reason: str | None = None) -> Response:
        return response_object(self.response_id, self.created_at, status, self.model, list(self.output),
                        completed_at=int(time.time()) if status == "completed" else None,
                        usage=response_usage(usage) if usage is not None else None, error=error,
                        incomplete_reason=incomplete_reason, echo=self.settings)

    # ---- the answer as it comes --------------------------------------------------------------------

    def start(self) -> list[Event]:
        snapshot = self.response("in_progress")
        return [response_event("created", self._next(), snapshot),
                response_event("in_progress", self._next(), snapshot)]

    def still_in_progress(self, progress: PromptProgress | None = None) -> Event:
        """The same snapshot again, while a long prompt is prefilled: the stream shows it moving (with llama-server's
        `prompt_progress` when the request asked for it)."""
        event = response_event("in_progress", self._next(), self.response("in_progress"))
        if progress is not None:
            event["prompt_progress"] = progress
        return event

    def text(self, delta: str) -> list[Event]:
        if not delta:
            return []
        events: list[Event] = []
        if self._message is None:
            if not (self._held + delta).strip():
                self._held += delta
                return []
            delta, self._held = self._held + delta, ""
            events += self._open_message()
        events.append(self._delta_event(delta))
        return events

    def tool_call(self, call: ParsedToolCall) -> list[Event]:
        events = self._close_message("completed")
        item_id = new_id("fc")
        done = function_call_item(item_id, "completed", call.id, call.name, call.arguments)
        self.output.append(done)
        index = len(self.output) - 1
        events.append(output_item_event("added", self._next(), index,
                                        function_call_item(item_id, "in_progress", call.id, call.name, "")))
        events.append(arguments_delta_event(self._next(), item_id, index, call.arguments))
        events.append(arguments_done_event(self._next(), item_id, index, call.arguments))
        events.append(output_item_event("done", self._next(), index, {**done}))
        return events

    def finish(self, usage: Usage, *, incomplete_reason: str | None = None) -> list[Event]:
        """The end: `incomplete_reason` ("max_output_tokens", or "timeout" for --request-timeout) when cut short."""
        status = "incomplete" if incomplete_reason else "completed"
        events: list[Event] = []
        if not self.output:
            held = self._held
            events += self._open_message()
            if held:
                events.append(self._delta_event(held))
        events += self._close_message(status)
        final = self.response(status, usage, incomplete_reason=incomplete_reason)
        events.append(response_event(status, self._next(), final))
        return events

    def failed(self, message: str, usage: Usage | None = None) -> list[Event]:
        events = self._close_message("incomplete")
        failure = self.response("failed", usage, error=response_error(message))
        events.append(response_event("failed", self._next(), failure))
        return events

    # ---- the message item ---------------------------------------------------------------------------

    def _index(self, item: OutputItem) -> int:
        return next(i for i, candidate in enumerate(self.output) if candidate is item)

    def _open_message(self) -> list[Event]:
        self._message = message_item(new_id("msg"), "in_progress", [])
        self._text = []
        self.output.append(self._message)
        index = len(self.output) - 1
        return [output_item_event("added", self._next(), index, _copy(self._message)),
                content_part_event("added", self._next(), self._message["id"], index, text_part(""))]

    def _delta_event(self, delta: str) -> Event:
        assert self._message is not None
        self._text.append(delta)
        self._held = ""
        return text_delta_event(self._next(), self._message["id"], self._index(self._message), delta)

    def _close_message(self, status: str) -> list[Event]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(self._text)
        index = self._index(message)
        message.update(status="incomplete" if status == "incomplete" else "completed", content=[text_part(text)])
        return [text_done_event(self._next(), message["id"], index, text),
                content_part_event("done", self._next(), message["id"], index, text_part(text)),
                output_item_event("done", self._next(), index, _copy(message))]


def _copy(item: MessageItem) -> MessageItem:
    return {**item, "content": [text_part(part["text"]) for part in item["content"]]}
