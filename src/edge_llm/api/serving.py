"""The serving layer: request bodies → engine requests, engine events → SSE or JSON.

One pipeline serves the three body shapes (simple prompt, OpenAI chat, legacy completions):
parse → prompt tokens (in the tokenizer thread) → one GenerationRequest per choice → the engine
→ per-choice events → the response format of the endpoint.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from edge_llm.api.errors import APIError, from_engine_error, from_pydantic, invalid_request
from edge_llm.api.limits import cap_max_tokens, check_prompt_tokens
from edge_llm.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    NamedToolChoice,
    PromptTokensDetails,
    SamplingDefaults,
    SimplePromptRequest,
    TokenizeRequest,
    UsageInfo,
    new_completion_id,
)
from edge_llm.api.sse import EventStreamResponse, encode_event
from edge_llm.prompting.tools import ParsedToolCall, ToolCallParser, forced_call_grammar
from edge_llm.prompting.chat_template import ChatTemplate, TemplateError
from edge_llm.config import Settings
from edge_llm.engine.channel import ReplyChannel
from edge_llm.engine.types import (
    EngineError,
    Failed,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    TokenLogprob,
    Usage,
)
from edge_llm.engine.worker import Engine
from edge_llm.logs import current_request_id, new_request_id
from edge_llm.prompting.prompt import PromptBuilder

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 64
# What may decode to a lone surrogate: a \ud800-\udfff escape, or its UTF-8-style bytes (json.loads decodes
# bytes with "surrogatepass"). A body with either is checked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


@dataclass
class ChoiceResult:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


@dataclass
class Generation:
    """One HTTP request's work in the engine: a GenerationRequest per choice, one reply channel."""

    requests: list[GenerationRequest]
    channel: ReplyChannel
    prompt_lengths: list[int]  # per distinct prompt
    prompt_of_choice: list[int]  # choice index → prompt index

    @property
    def request_id(self) -> str:
        return self.requests[0].request_id.split("/")[0]


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def total_usage(generation: Generation, finished: list[Finished | None]) -> Usage:
    """Each distinct prompt counts once, however many choices it had."""
    first_choice_of_prompt: dict[int, Finished] = {}
    for choice, done in enumerate(finished):
        if done is not None:
            first_choice_of_prompt.setdefault(generation.prompt_of_choice[choice], done)
    return Usage(
        prompt_tokens=sum(generation.prompt_lengths),
        completion_tokens=sum(done.usage.completion_tokens for done in finished if done is not None),
        cached_tokens=sum(done.usage.cached_tokens for done in first_choice_of_prompt.values()),
    )


def merged_timings(finished: list[Finished | None]) -> dict[str, float]:
    done = [f for f in finished if f is not None]
    if not done:
        return {}
    return {key: max(f.timings.get(key, 0.0) for f in done) for key in done[0].timings}


def failure_error(failed: Failed) -> APIError:
    if failed.code == "context_length_exceeded":
        return invalid_request(failed.message, param="messages", code=failed.code)
    if failed.code == "invalid_request":
        return invalid_request(failed.message, code=failed.code)
    return APIError(503, failed.message, code=failed.code)


def _piece_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}."""
    return {
        "content": [
            {
                "token": _piece_text(entry.piece),
                "logprob": entry.logprob,
                "bytes": list(entry.piece),
                "top_logprobs": [
                    {"token": _piece_text(piece), "logprob": logprob, "bytes": list(piece)}
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
        position += len(_piece_text(entry.piece))
    return {
        "tokens": [_piece_text(entry.piece) for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{_piece_text(piece): logprob for _, piece, logprob in entry.top} for entry in entries],
        "text_offset": offsets,
    }


def sse_json(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass
class ChatPlan:
    """What a chat request needs beyond the prompt: its grammar and the tools it may call."""

    grammar: str | None
    tools: bool


class ChatService:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.defaults = SamplingDefaults(
            temperature=settings.default_temperature,
            top_p=settings.default_top_p,
            top_k=settings.default_top_k,
            max_tokens=settings.default_max_tokens,
        )
        self.model_id = settings.model_name
        self.created = int(time.time())
        # Tokenizing, template rendering and grammar compiling stay off the event loop and the engine thread.
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-llm-tokenizer")
        self._prompt_builder: PromptBuilder | None = None
        self._schema_grammar = functools.lru_cache(maxsize=GRAMMAR_CACHE_SIZE)(self._compile_schema_grammar)
        # The tokenizer thread reads the model that the engine thread frees when it ends (stop, or a crash):
        # the engine runs this first, on its thread.
        engine.add_close_hook(self.close)

    def close(self) -> None:
        """Takes no more tokenizer work and waits for what was queued: after it returns, nothing here uses
        the runner. Blocking; idempotent."""
        # Queued tasks still run (the model is not freed yet): a cancelled one would raise CancelledError
        # into a request that was not cancelled. Later ones get 503 from _off_loop.
        self._tokenizer_pool.shutdown(wait=True)

    # ---- models ------------------------------------------------------------------------

    @property
    def model_names(self) -> set[str]:
        names = {self.model_id, self.settings.model.name}
        if self.settings.model_alias:
            names.add(self.settings.model_alias)
        return names

    def check_model(self, name: str | None) -> None:
        if name and name not in self.model_names:
            raise APIError(
                404,
                f"The model '{name}' does not exist; this server serves '{self.model_id}'",
                code="model_not_found",
                param="model",
            )

    def list_models(self) -> ModelList:
        return ModelList(data=[self._model_card()])

    def _model_card(self) -> ModelCard:
        meta: dict[str, Any] = {"n_ctx": self.settings.ctx_size, "path": str(self.settings.model)}
        if self.settings.model_alias:
            meta["alias"] = self.settings.model_alias
        runner = self.engine.runner
        if runner is not None:
            info = runner.info
            meta.update(n_params=info.n_params, size=info.size_bytes, n_ctx_train=info.n_ctx_train,
                        n_vocab=info.n_vocab, description=info.description)
        return ModelCard(id=self.model_id, created=self.created, meta=meta)

    # ---- endpoints ------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        body = await self._json_body(request)
        if "messages" in body and "prompt" in body:
            raise invalid_request("Give either 'prompt' or 'messages', not both", param="prompt")
        if "messages" in body:
            chat = self._parse(ChatCompletionRequest, body)
            self.check_model(chat.model)
            return await self._openai_chat(request, chat)
        if "prompt" in body:
            simple = self._parse(SimplePromptRequest, body)
            return await self._simple_chat(simple)
        raise invalid_request("Missing required parameter: 'messages' (or 'prompt')", param="messages",
                              code="missing_required_parameter")

    async def completions(self, request: Request) -> Response:
        completion = self._parse(CompletionRequest, await self._json_body(request))
        self.check_model(completion.model)
        self._check_logit_bias(completion.logit_bias)
        prompts = [
            await self._off_loop(self._tokenize_raw, text) for text in completion.prompts
        ]
        generation = self._start(
            prompts,
            n=completion.n,
            max_tokens=completion.requested_max_tokens(self.defaults),
            sampling=lambda choice: completion.sampling_params(self.defaults, choice),
            stop=completion.stop_strings(),
            logprobs=completion.logprobs,
        )
        echo = [text if completion.echo else "" for text in completion.prompts]
        if completion.stream:
            return self._stream(generation, self._completion_chunks(generation, echo, completion.include_usage))
        results = await self._collect(request, generation)
        return JSONResponse(self._completion_body(generation, results, echo), headers=self._headers(generation))

    async def tokenize(self, request: Request) -> JSONResponse:
        body = self._parse(TokenizeRequest, await self._json_body(request))
        self.check_model(body.model)
        runner = self._runner()
        tokens = await self._off_loop(
            runner.tokenize, body.content, add_special=body.add_special, parse_special=body.parse_special
        )
        return JSONResponse({"tokens": tokens, "count": len(tokens)})

    async def detokenize(self, request: Request) -> JSONResponse:
        body = self._parse(DetokenizeRequest, await self._json_body(request))
        self.check_model(body.model)
        runner = self._runner()
        for position, token in enumerate(body.tokens):
            if not runner.is_valid_token(token):
                raise invalid_request(f"Token id {token} is outside the vocabulary (0..{runner.n_vocab - 1})",
                                      param=f"tokens.{position}")
        return JSONResponse({"content": await self._off_loop(runner.detokenize, body.tokens)})

    # ---- chat -------------------------------------------------------------------------------

    async def _simple_chat(self, simple: SimplePromptRequest) -> Response:
        prompt = await self._off_loop(self._build_prompt, simple.to_messages(), None)
        generation = self._start(
            [prompt], n=1, max_tokens=simple.requested_max_tokens(self.defaults),
            sampling=lambda _: simple.sampling_params(self.defaults), stop=(), logprobs=None,
        )
        return self._stream(generation, self._simple_events(generation))

    async def _openai_chat(self, request: Request, chat: ChatCompletionRequest) -> Response:
        self._check_logit_bias(chat.logit_bias)
        tools = [tool.model_dump(exclude_none=True) for tool in chat.active_tools]
        plan = ChatPlan(grammar=await self._off_loop(self._chat_grammar, chat), tools=bool(tools))
        prompt = await self._off_loop(self._build_prompt, chat.to_messages(), tools or None)
        generation = self._start(
            [prompt], n=chat.n, max_tokens=chat.requested_max_tokens(self.defaults),
            sampling=lambda choice: chat.sampling_params(self.defaults, choice, plan.grammar),
            stop=chat.stop_strings(), logprobs=chat.logprob_count,
        )
        if chat.stream:
            return self._stream(generation, self._chat_chunks(generation, plan, chat.include_usage))
        results = await self._collect(request, generation)
        return JSONResponse(self._chat_body(generation, results, plan), headers=self._headers(generation))

    def _chat_grammar(self, chat: ChatCompletionRequest) -> str | None:
        """A grammar for response_format or a forced tool call (runs in the tokenizer thread)."""
        functions = [tool.function.model_dump(exclude_none=True) for tool in chat.active_tools]
        if isinstance(chat.tool_choice, NamedToolChoice):
            wanted = chat.tool_choice.function.name
            return self._checked_grammar(forced_call_grammar(
                [f for f in functions if f["name"] == wanted], functools.partial(self._schema_to_gbnf, param="tools")),
                param="tool_choice")
        if chat.tool_choice == "required":
            return self._checked_grammar(
                forced_call_grammar(functions, functools.partial(self._schema_to_gbnf, param="tools")), param="tools")
        response_format = chat.response_format
        if response_format is None or response_format.type == "text":
            return None
        schema = {"type": "object"} if response_format.json_schema is None else response_format.json_schema.schema_
        return self._schema_grammar(json.dumps(schema, sort_keys=True))

    def _compile_schema_grammar(self, schema_json: str) -> str:
        """JSON schema → checked GBNF; cached (bounded) by the schema's canonical JSON."""
        return self._checked_grammar(self._schema_to_gbnf(json.loads(schema_json)), param="response_format")

    def _schema_to_gbnf(self, schema: dict[str, Any], *, param: str = "response_format") -> str:
        from edge_llm.engine.runner import GrammarError, json_schema_to_grammar

        try:
            return json_schema_to_grammar(schema)
        except GrammarError as exc:
            raise invalid_request(str(exc), param=param, code="invalid_schema") from None

    def _checked_grammar(self, grammar: str, *, param: str) -> str:
        from edge_llm.engine.runner import GrammarError

        try:
            self._runner().check_grammar(grammar)
        except GrammarError as exc:
            raise invalid_request(f"{exc}", param=param, code="invalid_schema") from None
        return grammar

    def _chat_body(self, generation: Generation, results: list[ChoiceResult], plan: ChatPlan) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            assert result.finished is not None
            content: str | None = result.text
            calls: list[ParsedToolCall] = []
            if plan.tools:
                parser = ToolCallParser()
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
                "logprobs": chat_logprobs(result.logprobs) if generation.requests[index].logprobs is not None
                else None,
                "finish_reason": "tool_calls" if calls else result.finished.reason.value,
            })
        finished = [r.finished for r in results]
        return self._response_body(new_completion_id(), "chat.completion", choices, generation, finished)

    async def _chat_chunks(self, generation: Generation, plan: ChatPlan, include_usage: bool
                           ) -> AsyncIterator[bytes]:
        completion_id = new_completion_id()
        created = int(time.time())
        want_logprobs = generation.requests[0].logprobs is not None
        parsers = [ToolCallParser() if plan.tools else None for _ in generation.requests]
        finished: list[Finished | None] = [None] * len(generation.requests)

        def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None, **extra: Any) -> bytes:
            # Built as a dict: this runs once per token, and OpenAI's shape keeps explicit nulls.
            return sse_json({
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
                yield sse_json(self._error_body(event))
        yield self._stream_end(generation, finished, include_usage,
                               {"id": completion_id, "object": "chat.completion.chunk", "created": created})

    def _stream_end(self, generation: Generation, finished: list[Finished | None], include_usage: bool,
                    header: dict[str, Any]) -> bytes:
        """The usage chunk (empty choices; only when asked for), then the end marker."""
        end = b"data: [DONE]\n\n"
        if not include_usage:
            return end
        usage = usage_info(total_usage(generation, finished)).model_dump()
        return sse_json({**header, "model": self.model_id, "choices": [], "usage": usage}) + end

    # ---- legacy completions --------------------------------------------------------------------

    def _completion_body(self, generation: Generation, results: list[ChoiceResult], echo: list[str]
                         ) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            assert result.finished is not None
            prefix = echo[generation.prompt_of_choice[index]]
            choices.append({
                "index": index,
                "text": prefix + result.text,
                "logprobs": completion_logprobs(result.logprobs, len(prefix))
                if generation.requests[index].logprobs is not None else None,
                "finish_reason": result.finished.reason.value,
            })
        finished = [r.finished for r in results]
        return self._response_body("cmpl-" + new_completion_id().removeprefix("chatcmpl-"), "text_completion",
                                   choices, generation, finished)

    def _response_body(self, completion_id: str, kind: str, choices: list[dict[str, Any]],
                       generation: Generation, finished: list[Finished | None]) -> dict[str, Any]:
        """The non-streamed answer of both endpoints: choices, summed usage and the extra `timings`."""
        return {
            "id": completion_id,
            "object": kind,
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
            "usage": usage_info(total_usage(generation, finished)).model_dump(),
            "system_fingerprint": None,
            "timings": merged_timings(finished),
        }

    async def _completion_chunks(self, generation: Generation, echo: list[str], include_usage: bool
                                 ) -> AsyncIterator[bytes]:
        completion_id = "cmpl-" + new_completion_id().removeprefix("chatcmpl-")
        created = int(time.time())
        want_logprobs = generation.requests[0].logprobs is not None
        offsets = [len(echo[generation.prompt_of_choice[i]]) for i in range(len(generation.requests))]
        finished: list[Finished | None] = [None] * len(generation.requests)

        def chunk(index: int, text: str, finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None, **extra: Any) -> bytes:
            return sse_json({
                "id": completion_id, "object": "text_completion", "created": created, "model": self.model_id,
                "choices": [{"index": index, "text": text,
                             "logprobs": completion_logprobs(logprobs or [], offsets[index]) if want_logprobs
                             else None,
                             "finish_reason": finish_reason}],
                **extra,
            })

        for index in range(len(generation.requests)):
            prefix = echo[generation.prompt_of_choice[index]]
            if prefix:
                yield chunk(index, prefix)
        async for index, event in generation.channel.choice_events():
            if isinstance(event, TextDelta):
                yield chunk(index, event.text, logprobs=list(event.logprobs))
                offsets[index] += len(event.text)
            elif isinstance(event, Finished):
                finished[index] = event
                yield chunk(index, "", event.reason.value, timings=event.timings)
            elif isinstance(event, Failed):
                yield sse_json(self._error_body(event))
        yield self._stream_end(generation, finished, include_usage,
                               {"id": completion_id, "object": "text_completion", "created": created})

    # ---- the simple body ------------------------------------------------------------------------

    async def _simple_events(self, generation: Generation) -> AsyncIterator[bytes]:
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
                yield encode_event(json.dumps(self._error_body(event)), event="error")

    # ---- shared steps -------------------------------------------------------------------------

    async def _json_body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
            # A lone surrogate ("\ud800") decodes to a str that is not Unicode text: it would fail
            # later, when an answer or an error message quoting it is encoded (a 500). Refused here.
            if _SURROGATE_ESCAPE.search(raw) or b"\x00" in raw[:4]:  # (a UTF-16/32 body: always checked)
                json.dumps(body, ensure_ascii=False).encode("utf-8")
        except RecursionError:
            raise APIError(400, "The request body is nested too deeply", code="invalid_json") from None
        except UnicodeEncodeError:
            raise APIError(400, "The request body contains a lone UTF-16 surrogate (a \\ud800-\\udfff escape "
                           "without its pair), which is not Unicode text", code="invalid_json") from None
        except ValueError as exc:  # not JSON, not UTF-8, or an integer of more than 4300 digits
            raise APIError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object", code="invalid_json")
        return body

    @staticmethod
    def _parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise from_pydantic(exc) from None
        except RecursionError:
            raise APIError(400, "The request body is nested too deeply", code="invalid_json") from None

    def _runner(self) -> Any:
        runner = self.engine.runner
        if runner is None or not self.engine.ready:
            message = ("The model is not loaded yet" if self.engine.alive and runner is None
                       else "The inference engine is not running")
            raise APIError(503, message, code="engine_unavailable", headers={"Retry-After": "2"})
        return runner

    async def _off_loop(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs in the tokenizer thread: vocabulary and template work never blocks the event loop."""
        self._runner()
        loop = asyncio.get_running_loop()
        try:
            pending = loop.run_in_executor(self._tokenizer_pool, functools.partial(function, *args, **kwargs))
        except RuntimeError:  # the pool is shut down: the engine is stopping
            raise APIError(503, "The inference engine is not running", code="engine_unavailable",
                           headers={"Retry-After": "2"}) from None
        try:
            return await pending
        except TemplateError as exc:
            raise from_engine_error(exc) from None

    def _check_logit_bias(self, logit_bias: dict[str, float] | None) -> None:
        runner = self._runner()
        for key in logit_bias or {}:
            if not runner.is_valid_token(int(key)):
                raise invalid_request(
                    f"logit_bias names token id {key}, outside the vocabulary (0..{runner.n_vocab - 1})",
                    param="logit_bias",
                )

    def _tokenize_raw(self, text: str) -> list[int]:
        return self._runner().tokenize(text, add_special=True, parse_special=True)

    def _build_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        if self._prompt_builder is None:
            runner = self._runner()
            info = runner.info
            template = ChatTemplate(info.chat_template, bos_token=info.bos_text, eos_token=info.eos_text)
            if template.is_fallback:
                logger.warning("the model has no chat template; using ChatML")
            self._prompt_builder = PromptBuilder(template, runner, bos_token=info.bos_token)
        return self._prompt_builder.build(messages, tools=tools)

    @property
    def context_limit(self) -> int:
        runner = self.engine.runner
        train = runner.info.n_ctx_train if runner is not None and runner.info.n_ctx_train > 0 else None
        return min(self.settings.ctx_size, train) if train else self.settings.ctx_size

    def _fit(self, prompt: list[int], max_tokens: int) -> int:
        check_prompt_tokens(self.settings, len(prompt))
        limit = self.context_limit
        if len(prompt) >= limit:
            raise invalid_request(
                f"This model's maximum context length is {limit} tokens; the prompt has {len(prompt)} tokens "
                "and leaves no room to generate",
                param="messages",
                code="context_length_exceeded",
            )
        # Beyond what fits, max_tokens is capped; the answer then ends with finish_reason "length".
        return min(cap_max_tokens(self.settings, max_tokens), limit - len(prompt))

    def _start(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        max_tokens: int,
        sampling: Callable[[int], SamplingParams],
        stop: tuple[str, ...],
        logprobs: int | None,
    ) -> Generation:
        """Submits one engine request per choice; choices of one prompt share its prefill (see scheduler)."""
        request_id = current_request_id() or new_request_id()  # the middleware's id
        budgets = [self._fit(prompt, max_tokens) for prompt in prompts]
        choices = len(prompts) * n
        channel = ReplyChannel(choices)
        generation = Generation([], channel, [len(p) for p in prompts], [i // n for i in range(choices)])
        for choice in range(choices):
            prompt_index = choice // n
            generation.requests.append(GenerationRequest(
                request_id=request_id if choices == 1 else f"{request_id}/{choice}",
                prompt_tokens=prompts[prompt_index],
                max_tokens=budgets[prompt_index],
                sampling=sampling(choice % n),
                stop=stop,
                logprobs=logprobs,
            ))
        submitted: list[GenerationRequest] = []
        try:
            for choice, engine_request in enumerate(generation.requests):
                self.engine.submit(engine_request, channel.sender(choice))
                submitted.append(engine_request)
        except EngineError as exc:
            for engine_request in submitted:
                self.engine.abort(engine_request.request_id)
            raise from_engine_error(exc) from None
        return generation

    def _abort(self, generation: Generation) -> None:
        for engine_request in generation.requests:
            self.engine.abort(engine_request.request_id)  # a no-op for those already finished

    def _headers(self, generation: Generation) -> dict[str, str]:
        return {"x-request-id": generation.request_id}

    def _stream(self, generation: Generation, events: AsyncIterator[bytes]) -> EventStreamResponse:
        async def guarded() -> AsyncIterator[bytes]:
            try:
                async for chunk in events:
                    yield chunk
            finally:
                self._abort(generation)

        return EventStreamResponse(
            guarded(),
            headers=self._headers(generation),
            on_disconnect=lambda: self._abort(generation),
            keepalive_interval=self.settings.sse_keepalive,
        )

    async def _collect(self, request: Request, generation: Generation) -> list[ChoiceResult]:
        async def gather() -> list[ChoiceResult]:
            results = [ChoiceResult() for _ in generation.requests]
            parts: list[list[str]] = [[] for _ in generation.requests]
            async for index, event in generation.channel.choice_events():
                if isinstance(event, TextDelta):
                    parts[index].append(event.text)
                    results[index].logprobs.extend(event.logprobs)
                elif isinstance(event, Finished):
                    results[index].finished = event
                    results[index].text = "".join(parts[index])
                elif isinstance(event, Failed):
                    self._abort(generation)
                    raise failure_error(event)
            return results

        result = asyncio.ensure_future(gather())
        watcher = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not result.done():
                self._abort(generation)
                result.cancel()
        if not result.done():
            # The client left: nobody reads this answer, but it ends the request as handled (access status
            # 499) instead of as an exception that uvicorn logs with a traceback.
            raise APIError(499, "The client closed the connection before the answer",
                           code="client_closed_request", error_type="invalid_request_error")
        return result.result()

    @staticmethod
    def _error_body(failed: Failed) -> dict[str, Any]:
        return ErrorResponse(error=failure_error(failed).detail()).model_dump()
