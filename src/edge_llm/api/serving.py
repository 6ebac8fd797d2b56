"""The serving layer: request bodies → engine requests, engine events → SSE or JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from edge_llm.api.errors import APIError, from_engine_error, from_pydantic, invalid_request
from edge_llm.api.limits import cap_max_tokens, check_prompt_tokens
from edge_llm.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    SamplingDefaults,
    SimplePromptRequest,
    Timings,
    UsageInfo,
    new_completion_id,
)
from edge_llm.api.sse import EventStreamResponse, encode_event
from edge_llm.chat_template import ChatTemplate, TemplateError
from edge_llm.config import Settings
from edge_llm.engine.channel import ReplyChannel
from edge_llm.engine.types import EngineError, Failed, Finished, GenerationRequest, TextDelta, Usage
from edge_llm.engine.worker import Engine
from edge_llm.logs import current_request_id, new_request_id
from edge_llm.prompt import PromptBuilder

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    text: str
    finished: Finished


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def failure_error(failed: Failed) -> APIError:
    if failed.code == "context_length_exceeded":
        return invalid_request(failed.message, param="messages", code=failed.code)
    return APIError(503, failed.message, code=failed.code)


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ChatService:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.defaults = SamplingDefaults(
            temperature=settings.default_temperature,
            top_p=settings.default_top_p,
            max_tokens=settings.default_max_tokens,
        )
        self.model_id = settings.model_name
        self.created = int(time.time())
        # Tokenizing and template rendering stay off the event loop, and off the engine thread.
        self._tokenizer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-llm-tokenizer")
        self._prompt_builder: PromptBuilder | None = None

    def close(self) -> None:
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)

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
        runner = self.engine.runner
        if runner is not None:
            info = runner.info
            meta.update(n_params=info.n_params, size=info.size_bytes, n_ctx_train=info.n_ctx_train,
                        n_vocab=info.n_vocab, description=info.description)
        return ModelCard(id=self.model_id, created=self.created, meta=meta)

    # ---- chat completions -----------------------------------------------------------------

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
            return await self._simple_chat(request, simple)
        raise invalid_request("Missing required parameter: 'messages' (or 'prompt')", param="messages",
                              code="missing_required_parameter")

    async def _simple_chat(self, request: Request, simple: SimplePromptRequest) -> Response:
        generation = await self._generation_request(
            simple.to_messages(), simple.requested_max_tokens(self.defaults), simple.sampling_params(self.defaults), ()
        )
        channel = self._submit(generation)
        return self._stream(generation, self._simple_events(channel))

    async def _openai_chat(self, request: Request, chat: ChatCompletionRequest) -> Response:
        generation = await self._generation_request(
            chat.to_messages(),
            chat.requested_max_tokens(self.defaults),
            chat.sampling_params(self.defaults),
            chat.stop_strings(),
        )
        channel = self._submit(generation)
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            return self._stream(generation, self._chat_chunks(channel, include_usage))
        outcome = await self._collect(request, generation, channel)
        completion = ChatCompletion(
            id=new_completion_id(),
            model=self.model_id,
            choices=[
                ChatChoice(
                    message=AssistantMessage(content=outcome.text),
                    finish_reason=outcome.finished.reason.value,
                )
            ],
            usage=usage_info(outcome.finished.usage),
            timings=Timings(**outcome.finished.timings),
        )
        return JSONResponse(completion.model_dump(), headers=self._headers(generation))

    # ---- shared steps -------------------------------------------------------------------------

    async def _json_body(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise APIError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:
            raise APIError(400, "The request body is nested too deeply", code="invalid_json") from None
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object", code="invalid_json")
        return body

    @staticmethod
    def _parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            raise from_pydantic(exc) from None

    async def _generation_request(
        self, messages: list[dict[str, Any]], max_tokens: int, sampling: Any, stop: tuple[str, ...]
    ) -> GenerationRequest:
        if not self.engine.ready:
            raise APIError(503, "The model is not loaded yet", code="engine_unavailable",
                           headers={"Retry-After": "2"})
        loop = asyncio.get_running_loop()
        try:
            prompt = await loop.run_in_executor(self._tokenizer_pool, self._build_prompt, messages)
        except TemplateError as exc:
            raise from_engine_error(exc) from None
        check_prompt_tokens(self.settings, len(prompt))
        limit = self.context_limit
        if len(prompt) >= limit:
            raise invalid_request(
                f"This model's maximum context length is {limit} tokens; the prompt has {len(prompt)} tokens "
                "and leaves no room to generate",
                param="messages",
                code="context_length_exceeded",
            )
        return GenerationRequest(
            request_id=current_request_id() or new_request_id(),  # the middleware's id
            prompt_tokens=prompt,
            max_tokens=min(cap_max_tokens(self.settings, max_tokens), limit - len(prompt)),
            sampling=sampling,
            stop=stop,
        )

    @property
    def context_limit(self) -> int:
        runner = self.engine.runner
        train = runner.info.n_ctx_train if runner is not None and runner.info.n_ctx_train > 0 else None
        return min(self.settings.ctx_size, train) if train else self.settings.ctx_size

    def _build_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        if self._prompt_builder is None:
            runner = self.engine.runner
            info = runner.info
            template = ChatTemplate(info.chat_template, bos_token=info.bos_text, eos_token=info.eos_text)
            if template.is_fallback:
                logger.warning("the model has no chat template; using ChatML")
            self._prompt_builder = PromptBuilder(template, runner, bos_token=info.bos_token)
        return self._prompt_builder.build(messages)

    def _submit(self, generation: GenerationRequest) -> ReplyChannel:
        channel = ReplyChannel()
        try:
            self.engine.submit(generation, channel)
        except EngineError as exc:
            raise from_engine_error(exc) from None
        return channel

    def _headers(self, generation: GenerationRequest) -> dict[str, str]:
        return {"x-request-id": generation.request_id}

    def _stream(self, generation: GenerationRequest, events: AsyncIterator[bytes]) -> EventStreamResponse:
        async def guarded() -> AsyncIterator[bytes]:
            try:
                async for chunk in events:
                    yield chunk
            finally:
                self.engine.abort(generation.request_id)  # a no-op when it already finished

        return EventStreamResponse(
            guarded(),
            headers=self._headers(generation),
            on_disconnect=lambda: self.engine.abort(generation.request_id),
        )

    async def _collect(self, request: Request, generation: GenerationRequest, channel: ReplyChannel) -> Outcome:
        async def gather() -> Outcome:
            parts: list[str] = []
            async for event in channel:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, Finished):
                    return Outcome("".join(parts), event)
                elif isinstance(event, Failed):
                    raise failure_error(event)
            raise APIError(503, "the engine closed the request", code="engine_unavailable")

        result = asyncio.ensure_future(gather())
        watcher = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not result.done():
                self.engine.abort(generation.request_id)
                result.cancel()
        if not result.done():
            raise asyncio.CancelledError()
        return result.result()

    # ---- event formats --------------------------------------------------------------------------

    async def _simple_events(self, channel: ReplyChannel) -> AsyncIterator[bytes]:
        async for event in channel:
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
                yield encode_event(self._error_json(event), event="error")

    async def _chat_chunks(self, channel: ReplyChannel, include_usage: bool) -> AsyncIterator[bytes]:
        completion_id = new_completion_id()
        created = int(time.time())

        def chunk(delta: dict[str, str], finish_reason: str | None = None, **extra: Any) -> bytes:
            # Built as a dict: this runs once per token, and OpenAI's shape keeps explicit nulls.
            body = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
                **extra,
            }
            return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

        yield chunk({"role": "assistant", "content": ""})
        async for event in channel:
            if isinstance(event, TextDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, Finished):
                yield chunk({}, event.reason.value, timings=event.timings)
                if include_usage:
                    usage = ChatCompletionChunk(
                        id=completion_id, created=created, model=self.model_id, choices=[],
                        usage=usage_info(event.usage),
                    )
                    yield b"data: " + usage.model_dump_json(exclude_none=True).encode() + b"\n\n"
            elif isinstance(event, Failed):
                yield b"data: " + self._error_json(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _error_json(failed: Failed) -> str:
        return ErrorResponse(error=failure_error(failed).detail()).model_dump_json()
