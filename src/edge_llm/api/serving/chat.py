"""POST /v1/chat/completions: the OpenAI chat body and the simple `{"prompt": ...}` body.

Messages → the model's chat template → prompt tokens (in the tokenizer thread); a grammar when the answer is
constrained (`response_format`, a forced tool call); then the answer as OpenAI's chat JSON or chunks, or, for
the simple body, as a plain-text SSE stream.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import invalid_request
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest, NamedToolChoice, SimplePromptRequest
from edge_llm.api.protocol.openai_answers import (
    ChatCompletionAnswer,
    ChatDelta,
    StreamHead,
    chat_choice,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    new_completion_id,
    simple_done,
)
from edge_llm.api.request_context import RequestContext, request_context
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.grammars import Grammars
from edge_llm.api.serving.outcome import ChoiceResult, Generation, error_body, merged_timings, usage_info
from edge_llm.api.serving.tool_calls import ToolCallTail, forced_call, split_calls
from edge_llm.api.sse import encode_event, encode_json_event
from edge_llm.engine.types import Failed, Finished, TextDelta, TokenLogprob
from edge_llm.prompting.tools import ParsedToolCall

logger = logging.getLogger(__name__)


@dataclass
class ChatPlan:
    """What an OpenAI chat request (or the Responses request it amounts to) needs beyond the prompt: its grammar
    and the tools it may call."""

    grammar: str | None
    tools: tuple[str, ...]  # the names of the functions it may call


def chat_plan(grammars: Grammars, chat: ChatCompletionRequest) -> ChatPlan:
    """The grammar and tool names of an OpenAI chat request (runs in the tokenizer thread)."""
    return ChatPlan(grammar=chat_grammar(grammars, chat), tools=tuple(tool.function.name for tool in chat.active_tools))


def chat_grammar(grammars: Grammars, chat: ChatCompletionRequest) -> str | None:
    """A grammar for response_format, a forced tool call, or llama-server's `grammar`/`json_schema`."""
    if chat.grammar is not None or chat.json_schema is not None:
        if chat.response_format is not None and chat.response_format.type != "text" or chat.tool_choice not in (
                None, "auto", "none"):
            raise invalid_request("grammar and json_schema cannot be combined with response_format or a "
                                  "forced tool call", param="grammar" if chat.grammar else "json_schema")
        return grammars.native(chat)
    functions = [tool.function.model_dump(exclude_none=True) for tool in chat.active_tools]
    if isinstance(chat.tool_choice, NamedToolChoice):
        wanted = chat.tool_choice.function.name
        return forced_call(grammars, [f for f in functions if f["name"] == wanted], param="tool_choice")
    if chat.tool_choice == "required":
        return forced_call(grammars, functions, param="tools")
    response_format = chat.response_format
    if response_format is None or response_format.type == "text":
        return None
    schema = {"type": "object"} if response_format.json_schema is None else response_format.json_schema.schema_
    return grammars.schema(schema, param="response_format")


class ChatServing(Serving):
    async def chat_completions(self, request: Request) -> Response:
        context = request_context(request)
        body = await self.json_body(request)
        if "messages" in body and "prompt" in body:
            raise invalid_request("Give either 'prompt' or 'messages', not both", param="prompt")
        if "messages" in body:
            chat = self.parse(context, ChatCompletionRequest, body)
            self.check_model(chat.model)
            return await self._openai_chat(request, context, chat)
        if "prompt" in body:
            return await self._simple_chat(context, self.parse(context, SimplePromptRequest, body))
        raise invalid_request("Missing required parameter: 'messages' (or 'prompt')", param="messages",
                              code="missing_required_parameter")

    # ---- the OpenAI chat body -------------------------------------------------------------------

    async def _openai_chat(self, request: Request, context: RequestContext, chat: ChatCompletionRequest) -> Response:
        self.check_logit_bias(chat.logit_bias)
        plan = await self.off_loop(context, chat_plan, self.grammars, chat)
        tools = [tool.model_dump(exclude_none=True) for tool in chat.active_tools]
        prompt = await self.off_loop(context, self.chat_prompt, chat.to_messages(), tools or None)
        generation = self.start(
            context, [prompt], n=chat.n, max_tokens=chat.requested_max_tokens(self.defaults),
            sampling=lambda choice: chat.sampling_params(self.defaults, choice, plan.grammar),
            stop=chat.stop_strings(), logprobs=chat.logprob_count, cache_prompt=chat.cache_prompt,
            speculative=chat.speculative,
        )
        if chat.stream:
            return self.stream(generation, self._chat_chunks(generation, plan, chat.include_usage))
        results = await self.collect(request, generation)
        return JSONResponse(self._chat_body(generation, results, plan), headers=self.headers(generation))

    # ---- the OpenAI chat answer -----------------------------------------------------------------

    def _chat_body(self, generation: Generation, results: list[ChoiceResult], plan: ChatPlan
                   ) -> ChatCompletionAnswer:
        choices = []
        for index, result in enumerate(results):
            assert result.finished is not None
            text, calls = split_calls(result.text, plan.tools)
            choices.append(chat_choice(
                index, text or None if calls else text, [call.to_openai() for call in calls],
                "tool_calls" if calls else result.finished.reason.value,
                chat_logprobs(result.logprobs) if generation.wants_logprobs else None))
        finished = [r.finished for r in results]
        return chat_completion(new_completion_id(), generation.model, choices,
                               self.answer_usage(generation, finished), merged_timings(finished))

    async def _chat_chunks(self, generation: Generation, plan: ChatPlan, include_usage: bool
                           ) -> AsyncIterator[bytes]:
        head = StreamHead(new_completion_id(), int(time.time()), generation.model)
        want_logprobs = generation.wants_logprobs
        tails = [ToolCallTail(plan.tools) for _ in generation.requests]
        finished: list[Finished | None] = [None] * len(generation.requests)

        def chunk(index: int, delta: ChatDelta, finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None, timings: dict[str, float] | None = None) -> bytes:
            return encode_json_event(chat_chunk(
                head, index, delta, finish_reason,
                chat_logprobs(logprobs) if want_logprobs and logprobs is not None else None, timings))

        def content_chunks(index: int, text: str, calls: list[ParsedToolCall],
                           logprobs: list[TokenLogprob]) -> list[bytes]:
            out = []
            if text or (logprobs and not calls):
                out.append(chunk(index, {"content": text}, logprobs=list(logprobs)))
            for call in calls:
                out.append(chunk(index, {"tool_calls": [call.to_openai(tails[index].index(call))]}))
            return out

        for index in range(len(generation.requests)):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for index, event in generation.channel.choice_events():
            tail = tails[index]
            if isinstance(event, TextDelta):
                text, calls = tail.feed(event.text)
                for data in content_chunks(index, text, calls, list(event.logprobs)):
                    yield data
            elif isinstance(event, Finished):
                finished[index] = event
                text, calls = tail.finish()
                for data in content_chunks(index, text, calls, []):
                    yield data
                reason = "tool_calls" if tail.calls else event.reason.value
                yield chunk(index, {}, reason, timings=event.timings)
            elif isinstance(event, Failed):
                yield encode_json_event(error_body(event))
        yield self.stream_end(generation, finished, include_usage, head, "chat.completion.chunk")

    # ---- the simple body: {"prompt": ...} in, plain text out ---------------------------------------

    async def _simple_chat(self, context: RequestContext, simple: SimplePromptRequest) -> Response:
        prompt = await self.off_loop(context, self.chat_prompt, simple.to_messages(), None)
        generation = self.start(
            context, [prompt], n=1, max_tokens=simple.requested_max_tokens(self.defaults),
            sampling=lambda _: simple.sampling_params(self.defaults), stop=(), logprobs=None,
        )
        return self.stream(generation, self._simple_events(generation))

    async def _simple_events(self, generation: Generation) -> AsyncIterator[bytes]:
        """The text as plain SSE `data:` events, then a `done` event (or an `error` event)."""
        async for _, event in generation.channel.choice_events():
            if isinstance(event, TextDelta):
                yield encode_event(event.text)
            elif isinstance(event, Finished):
                done = simple_done(event.reason.value, usage_info(event.usage).model_dump(), event.timings)
                yield encode_event(json.dumps(done), event="done")
            elif isinstance(event, Failed):
                yield encode_event(json.dumps(error_body(event)), event="error")

