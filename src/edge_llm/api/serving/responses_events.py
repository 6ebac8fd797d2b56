"""The Responses API's answer shapes: output items, the Response object and its stream of events.

One `ResponseBuilder` follows an answer as it comes (text deltas, tool calls, the end) and returns the events a
stream sends, numbered by `sequence_number`; a non-streamed answer runs the same builder and keeps only the final
Response, so both carry the same items. Pure: no engine, no I/O (tests/unit/test_responses.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from edge_llm.engine.types import Usage
from edge_llm.prompting.tools import ParsedToolCall

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


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
        self.output: list[dict[str, Any]] = []
        self._sequence = 0
        self._message: dict[str, Any] | None = None
        self._text: list[str] = []
        self._held = ""

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def response(self, status: str, usage: Usage | None = None, *, error: dict[str, Any] | None = None,
                 incomplete_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "model": self.model,
            "output": list(self.output),
            "usage": response_usage(usage) if usage is not None else None,
            "previous_response_id": None,
            "reasoning": None,
            "truncation": "disabled",
            "background": False,
            **self.settings,
        }

    # ---- the answer as it comes --------------------------------------------------------------------

    def start(self) -> list[Event]:
        snapshot = self.response("in_progress")
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def still_in_progress(self) -> Event:
        """The same snapshot again, while a long prompt is prefilled: the stream shows it moving."""
        return self._event("response.in_progress", response=self.response("in_progress"))

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
        self._text.append(delta)
        assert self._message is not None
        events.append(self._event("response.output_text.delta", item_id=self._message["id"],
                                  output_index=self._index(self._message), content_index=0, delta=delta,
                                  logprobs=[]))
        return events

    def tool_call(self, call: ParsedToolCall) -> list[Event]:
        events = self._close_message("completed")
        item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call.id,
                "name": call.name, "arguments": ""}
        self.output.append(item)
        index = len(self.output) - 1
        events.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        events.append(self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=call.arguments))
        events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  arguments=call.arguments))
        item.update(status="completed", arguments=call.arguments)
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
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
        events.append(self._event(f"response.{status}", response=final))
        return events

    def failed(self, message: str, usage: Usage | None = None) -> list[Event]:
        events = self._close_message("incomplete")
        failure = self.response("failed", usage, error={"code": "server_error", "message": message})
        events.append(self._event("response.failed", response=failure))
        return events

    # ---- the message item ---------------------------------------------------------------------------

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, candidate in enumerate(self.output) if candidate is item)

    def _open_message(self) -> list[Event]:
        self._message = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                         "content": []}
        self._text = []
        self.output.append(self._message)
        index = len(self.output) - 1
        return [self._event("response.output_item.added", output_index=index, item=_copy(self._message)),
                self._event("response.content_part.added", item_id=self._message["id"], output_index=index,
                            content_index=0, part=text_part(""))]

    def _delta_event(self, delta: str) -> Event:
        assert self._message is not None
        self._text.append(delta)
        self._held = ""
        return self._event("response.output_text.delta", item_id=self._message["id"],
                           output_index=self._index(self._message), content_index=0, delta=delta, logprobs=[])

    def _close_message(self, status: str) -> list[Event]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(self._text)
        index = self._index(message)
        message.update(status=status, content=[text_part(text)])
        return [self._event("response.output_text.done", item_id=message["id"], output_index=index,
                            content_index=0, text=text, logprobs=[]),
                self._event("response.content_part.done", item_id=message["id"], output_index=index,
                            content_index=0, part=text_part(text)),
                self._event("response.output_item.done", output_index=index, item=_copy(message))]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": [dict(part) for part in item.get("content", [])]}
