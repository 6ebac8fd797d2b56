"""POST /v1/chat/completions: the OpenAI chat body and the simple `{"prompt": ...}` body.

Messages → the model's chat template → prompt tokens (in the tokenizer thread); a grammar when the answer is
constrained (`response_format`, a forced tool call); then the answer as OpenAI's chat JSON or chunks, or, for
the simple body, as a plain-text SSE stream.
"""

from __future__ import annotations

import functools
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
from edge_llm.api.protocol.openai_answers import new_completion_id
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.outcome import ChoiceResult, Generation, error_body, piece_text, usage_info
from edge_llm.api.sse import encode_event, encode_json_event
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient
from edge_llm.engine.types import Failed, Finished, TextDelta, TokenLogprob
from edge_llm.prompting.chat_template import ChatTemplate
from edge_llm.prompting.prompt import PromptBuilder
from edge_llm.prompting.tools import ParsedToolCall, ToolCallParser, forced_call_grammar

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 64


@dataclass
class ChatPlan:
    """What a chat request needs beyond the prompt: its grammar and the tools it may call."""

    grammar: str | None
    tools: tuple[str, ...]  # the names of the functions it may call


class ChatServing(Serving):
    def __init__(self, settings: Settings, engine: EngineClient, names: tuple[str, ...] = ()) -> None:
        super().__init__(settings, engine, names)
        self._prompt_builder: PromptBuilder | None = None
        self._schema_grammar = functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)(self._compile_schema_grammar)

    async def chat_completions(self, request: Request) -> Response:
        body = await self.json_body(request)
        if "messages" in body and "prompt" in body:
            raise invalid_request("Give either 'prompt' or 'messages', not both", param="prompt")
        if "messages" in body:
            chat = self.parse(ChatCompletionRequest, body)
            self.check_model(chat.model)
            return await self._openai_chat(request, chat)
        if "prompt" in body:
            return await self._simple_chat(self.parse(SimplePromptRequest, body))
        raise invalid_request("Missing required parameter: 'messages' (or 'prompt')", param="messages",
                              code="missing_required_parameter")

    # ---- the OpenAI chat body -------------------------------------------------------------------

    async def _openai_chat(self, request: Request, chat: ChatCompletionRequest) -> Response:
        self.check_logit_bias(chat.logit_bias)
        tools = [tool.model_dump(exclude_none=True) for tool in chat.active_tools]
        plan = ChatPlan(grammar=await self.off_loop(self._chat_grammar, chat),
                        tools=tuple(tool["function"]["name"] for tool in tools))
        prompt = await self.off_loop(self._build_prompt, chat.to_messages(), tools or None)
        generation = self.start(
            [prompt], n=chat.n, max_tokens=chat.requested_max_tokens(self.defaults),
            sampling=lambda choice: chat.sampling_params(self.defaults, choice, plan.grammar),
            stop=chat.stop_strings(), logprobs=chat.logprob_count, cache_prompt=chat.cache_prompt,
            speculative=chat.speculative,
        )
        if chat.stream:
            return self.stream(generation, self._chat_chunks(generation, plan, chat.include_usage))
        results = await self.collect(request, generation)
        return JSONResponse(self._chat_body(generation, results, plan), headers=self.headers(generation))

    def _build_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                      continue_final: bool = False) -> list[int]:
        """Messages → tokens through the model's chat template (runs in the tokenizer thread)."""
        if self._prompt_builder is None:
            info = self.engine.model_info
            assert info is not None  # the tokenizer thread runs only while the model is loaded
            if not info.chat_template:
                raise invalid_request(
                    f"The model '{self.model_id}' has no chat template (a base model): it cannot take chat messages. "
                    "Send the text to continue to /v1/completions instead", param="messages",
                    code="chat_template_missing")
            template = ChatTemplate(info.chat_template, bos_token=info.bos_text, eos_token=info.eos_text)
            self._prompt_builder = PromptBuilder(template, self.engine, bos_token=info.bos_token,
                                                control_tokens=info.control_tokens)
        return self._prompt_builder.build(messages, tools=tools, continue_final=continue_final,
                                          before_tokenizing=self.check_prompt_bytes)

    # ---- the grammar ------------------------------------------------------------------------------

    def _chat_grammar(self, chat: ChatCompletionRequest) -> str | None:
        """A grammar for response_format, a forced tool call, or llama-server's `grammar`/`json_schema` (runs in
        the tokenizer thread)."""
        if chat.grammar is not None or chat.json_schema is not None:
            if chat.response_format is not None and chat.response_format.type != "text" or chat.tool_choice not in (
                    None, "auto", "none"):
                raise invalid_request("grammar and json_schema cannot be combined with response_format or a "
                                      "forced tool call", param="grammar" if chat.grammar else "json_schema")
            return self.native_grammar(chat)
        functions = [tool.function.model_dump(exclude_none=True) for tool in chat.active_tools]
        if isinstance(chat.tool_choice, NamedToolChoice):
            wanted = chat.tool_choice.function.name
            return self.checked_grammar(forced_call_grammar(
                [f for f in functions if f["name"] == wanted], functools.partial(self.schema_to_gbnf, param="tools")),
                param="tool_choice")
        if chat.tool_choice == "required":
            return self.checked_grammar(
                forced_call_grammar(functions, functools.partial(self.schema_to_gbnf, param="tools")), param="tools")
        response_format = chat.response_format
        if response_format is None or response_format.type == "text":
            return None
        schema = {"type": "object"} if response_format.json_schema is None else response_format.json_schema.schema_
        # Not sort_keys: the grammar writes an object's properties in the schema's order, as OpenAI does.
        return self._schema_grammar(json.dumps(schema))

    def _compile_schema_grammar(self, schema_json: str) -> str:
        """JSON schema → checked GBNF; cached (bounded) by the schema's JSON text."""
        return self.checked_grammar(self.schema_to_gbnf(json.loads(schema_json)), param="response_format")

    # ---- the OpenAI chat answer -----------------------------------------------------------------

    def _chat_body(self, generation: Generation, results: list[ChoiceResult], plan: ChatPlan) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            assert result.finished is not None
            content: str | None = result.text
            calls: list[ParsedToolCall] = []
            if plan.tools:
                parser = ToolCallParser(plan.tools)
                head, _ = parser.feed(result.text)
                tail, _ = parser.finish()
                calls = parser.calls
                content = (head + tail) or None if calls else head + tail
            message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
            if calls:
                message["tool_calls"] = [call.to_openai() for call in calls]
            choices.append({
                "index": index,
                "message": message,
                "logprobs": chat_logprobs(result.logprobs) if generation.wants_logprobs else None,
                "finish_reason": "tool_calls" if calls else result.finished.reason.value,
            })
        finished = [r.finished for r in results]
        return self.response_body(new_completion_id(), "chat.completion", choices, generation, finished)

    async def _chat_chunks(self, generation: Generation, plan: ChatPlan, include_usage: bool
                           ) -> AsyncIterator[bytes]:
        completion_id = new_completion_id()
        created = int(time.time())
        want_logprobs = generation.wants_logprobs
        parsers = [ToolCallParser(plan.tools) if plan.tools else None for _ in generation.requests]
        finished: list[Finished | None] = [None] * len(generation.requests)

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None, **extra: Any) -> bytes:
            # Built as a dict: this runs once per token, and OpenAI's shape keeps explicit nulls.
            return encode_json_event({
                "id": completion_id, "object": "chat.completion.chunk", "created": created, "model": self.model_id,
                "choices": [{"index": index, "delta": delta,
                             "logprobs": chat_logprobs(logprobs) if want_logprobs and logprobs is not None else None,
                             "finish_reason": finish_reason}],
                **extra,
            })

        def content_chunks(index: int, text: str, calls: list[ParsedToolCall],
                           logprobs: list[TokenLogprob]) -> list[bytes]:
            out = []
            if text or (logprobs and not calls):
                out.append(chunk(index, {"content": text}, logprobs=list(logprobs)))
            parser = parsers[index]
            for call in calls:
                number = parser.calls.index(call) if parser else 0
                out.append(chunk(index, {"tool_calls": [call.to_openai(number)]}))
            return out

        for index in range(len(generation.requests)):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for index, event in generation.channel.choice_events():
            parser = parsers[index]
            if isinstance(event, TextDelta):
                text, calls = parser.feed(event.text) if parser else (event.text, [])
                for data in content_chunks(index, text, calls, list(event.logprobs)):
                    yield data
            elif isinstance(event, Finished):
                finished[index] = event
                reason = event.reason.value
                if parser is not None:
                    text, calls = parser.finish()
                    for data in content_chunks(index, text, calls, []):
                        yield data
                    if parser.calls:
                        reason = "tool_calls"
                yield chunk(index, {}, reason, timings=event.timings)
            elif isinstance(event, Failed):
                yield encode_json_event(error_body(event))
        yield self.stream_end(generation, finished, include_usage,
                              {"id": completion_id, "object": "chat.completion.chunk", "created": created})

    # ---- the simple body: {"prompt": ...} in, plain text out ---------------------------------------

    async def _simple_chat(self, simple: SimplePromptRequest) -> Response:
        prompt = await self.off_loop(self._build_prompt, simple.to_messages(), None)
        generation = self.start(
            [prompt], n=1, max_tokens=simple.requested_max_tokens(self.defaults),
            sampling=lambda _: simple.sampling_params(self.defaults), stop=(), logprobs=None,
        )
        return self.stream(generation, self._simple_events(generation))

    async def _simple_events(self, generation: Generation) -> AsyncIterator[bytes]:
        """The text as plain SSE `data:` events, then a `done` event (or an `error` event)."""
        async for _, event in generation.channel.choice_events():
            if isinstance(event, TextDelta):
                yield encode_event(event.text)
            elif isinstance(event, Finished):
                done = {
                    "finish_reason": event.reason.value,
                    "usage": usage_info(event.usage).model_dump(),
                    "timings": event.timings,
                }
                yield encode_event(json.dumps(done), event="done")
            elif isinstance(event, Failed):
                yield encode_event(json.dumps(error_body(event)), event="error")


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
