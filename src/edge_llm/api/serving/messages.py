"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (the anthropic SDKs, Claude Code).

It is the chat family in Anthropic's dialect, an adapter around the model's core: the same prompt builder and
grammar cache (serving/core.py), the same forced-call grammar (tool_choice `any` / `tool`) and tool-call tail
(serving/tool_calls.py). What differs is the wire: content blocks in and out, Anthropic's SSE events, stop_reason,
usage, and its error envelope (chosen
by path in api/errors.py, so middleware refusals on these routes wear it too).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import invalid_request
from edge_llm.api.params import report_ignored
from edge_llm.api.protocol.anthropic import CountTokensRequest, MessagesRequest, set_aside_server_tools
from edge_llm.api.protocol import anthropic_answers
from edge_llm.api.protocol.anthropic_answers import (
    ContentBlock,
    Message,
    StreamEvent,
    ToolUseBlock,
    block_start,
    block_stop,
    input_json_delta,
    message,
    message_delta,
    message_start,
    message_stop,
    new_message_id,
    ping,
    stop_reason,
    text_block,
    text_delta,
    usage,
)
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.outcome import Generation, failure_error
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.tool_calls import ToolCallTail, forced_call, split_calls
from edge_llm.api.serving.progress import PrefillBeats
from edge_llm.api.sse import encode_json_event
from edge_llm.engine.types import Failed, Finished, TextDelta
from edge_llm.prompting.tools import ParsedToolCall

logger = logging.getLogger(__name__)


class MessagesServing(Serving):
    async def messages(self, request: Request) -> Response:
        context = request_context(request)
        body = await self.json_body(request)
        if "max_tokens" not in body:  # Anthropic requires it; say so plainly instead of pydantic's wording
            raise invalid_request("max_tokens: Field required", param="max_tokens",
                                  code="missing_required_parameter")
        report_ignored(context, set_aside_server_tools(body))
        anthropic = self.parse(context, MessagesRequest, body)
        self.check_model(anthropic.model)
        grammar = await self.off_loop(context, self._grammar, anthropic)
        prompt = await self.off_loop(context, self.chat_prompt, anthropic.to_chat_messages(),
                                     anthropic.openai_tools(), continue_final=anthropic.continues_final)
        names = tuple(tool.name for tool in anthropic.active_tools)  # what the tool-call parser looks for
        generation = self.start(
            context, [prompt], n=1, max_tokens=anthropic.max_tokens,
            sampling=lambda _: anthropic.sampling_params(self.defaults, grammar),
            stop=tuple(anthropic.stop_sequences or ()), logprobs=None,
        )
        headers = {**self.headers(generation), "request-id": generation.request_id}  # the SDK reads request-id
        if anthropic.stream:
            beats = PrefillBeats(lambda: event(ping()))
            return self.stream(generation, self._events(generation, names, beats), headers=headers, beats=beats)
        result = (await self.collect(request, generation))[0]
        assert result.finished is not None
        return JSONResponse(self._message(generation, result.text, result.finished, names), headers=headers)

    async def count_tokens(self, request: Request) -> Response:
        context = request_context(request)
        raw = await self.json_body(request)
        report_ignored(context, set_aside_server_tools(raw))
        body = self.parse(context, CountTokensRequest, raw)
        self.check_model(body.model)
        prompt = await self.off_loop(context, self.chat_prompt, body.to_chat_messages(), body.openai_tools(),
                                     continue_final=body.continues_final)
        return JSONResponse(anthropic_answers.token_count(len(prompt)))

    def _grammar(self, anthropic: MessagesRequest) -> str | None:
        """tool_choice `any` / `tool`: a grammar makes the answer one call; output_config.format: the answer follows
        the schema (runs in the tokenizer thread)."""
        if anthropic.output_schema is not None:
            return self.grammars.schema(anthropic.output_schema, param="output_config.format")
        functions = anthropic.forced_functions()
        if functions is None:
            return None
        return forced_call(self.grammars, functions, param="tool_choice")

    # ---- the answer ----------------------------------------------------------------------------

    def _message(self, generation: Generation, text: str, finished: Finished, names: tuple[str, ...]
                 ) -> Message:
        text, calls = split_calls(text, names)
        content: list[ContentBlock] = []
        if text or not calls:  # a text block even when empty, so content[0] is there for simple clients
            content.append(text_block(text))
        content.extend(tool_use_block(call) for call in calls)
        return message(new_message_id(), generation.model, content, stop_reason(finished, bool(calls)),
                       finished.stop_sequence, usage(generation.prompt_lengths[0], finished.usage.completion_tokens,
                                                     finished.usage.cached_tokens))

    async def _events(self, generation: Generation, names: tuple[str, ...], beats: PrefillBeats
                      ) -> AsyncIterator[bytes]:
        """Anthropic's event sequence: message_start, ping (again while a long prompt is prefilled), content blocks
        (start, deltas, stop), message_delta with stop_reason and usage, message_stop; an `error` event when the
        engine fails midway."""
        blocks = _Blocks()
        tail = ToolCallTail(names)
        # The cached part of the prompt is known only at the end: message_delta has the final figures.
        yield event(message_start(message(new_message_id(), generation.model, [], None, None,
                                          usage(generation.prompt_lengths[0], 0, 0))))
        yield event(ping())
        beats.arm()
        async for _, engine_event in generation.channel.choice_events():
            beats.stop()
            if isinstance(engine_event, TextDelta):
                text, calls = tail.feed(engine_event.text)
                for data in blocks.add(text, calls):
                    yield data
            elif isinstance(engine_event, Finished):
                text, calls = tail.finish()
                for data in blocks.add(text, calls):
                    yield data
                for data in blocks.close(final=True):
                    yield data
                reason = stop_reason(engine_event, bool(tail.calls))
                yield event(message_delta(reason, engine_event.stop_sequence, usage(
                    generation.prompt_lengths[0], engine_event.usage.completion_tokens,
                    engine_event.usage.cached_tokens)))
                yield event(message_stop())
            elif isinstance(engine_event, Failed):
                yield encode_json_event(failure_error(engine_event).anthropic_body(), event="error")


class _Blocks:
    """The content blocks of a streamed answer: a text block opens at the first text and closes before a tool_use
    block; each tool call is a whole block (start, one input_json_delta, stop)."""

    def __init__(self) -> None:
        self.count = 0
        self.text_open = False

    def add(self, text: str, calls: list[ParsedToolCall]) -> list[bytes]:
        out: list[bytes] = []
        if text:
            if not self.text_open:
                out.append(self._start(text_block("")))
                self.text_open = True
            out.append(event(text_delta(self.count - 1, text)))
        for call in calls:
            out.extend(self.close())
            block = tool_use_block(call)
            out.append(self._start({**block, "input": {}}))
            out.append(event(input_json_delta(self.count - 1, json.dumps(block["input"], ensure_ascii=False))))
            out.append(self._stop())
        return out

    def close(self, final: bool = False) -> list[bytes]:
        """Closes an open text block; at the end, an answer without any block gets an empty text block."""
        if self.text_open:
            self.text_open = False
            return [self._stop()]
        if final and self.count == 0:
            return [self._start(text_block("")), self._stop()]
        return []

    def _start(self, block: ContentBlock) -> bytes:
        self.count += 1
        return event(block_start(self.count - 1, block))

    def _stop(self) -> bytes:
        return event(block_stop(self.count - 1))


def tool_use_block(call: ParsedToolCall) -> ToolUseBlock:
    return anthropic_answers.tool_use_block(call.id, call.name, call.arguments)


def event(payload: StreamEvent) -> bytes:
    """Anthropic names each event and repeats the name as the payload's `type`."""
    return encode_json_event(payload, event=payload["type"])
