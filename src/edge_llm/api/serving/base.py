"""What every endpoint family shares: body reading, the model check, work in the tokenizer thread, prompt
fitting, and a request's life in the engine (submit, collect, stream, cancel) with its headers and errors.

An endpoint family (chat, completions, tokenization, models, …) is one module with one `Serving` subclass;
a request's outcome in the OpenAI shapes (usage, timings, failures) is in outcome.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel

from edge_llm.api.errors import APIError, from_engine_error, invalid_request
from edge_llm.api.limits import cap_max_tokens, check_prompt_tokens
from edge_llm.api.params import parse_body
from edge_llm.api.request_context import RequestContext, request_context
from edge_llm.api.serving.core import ModelCore
from edge_llm.api.serving.body import request_json
from edge_llm.api.serving.outcome import ChoiceResult, Generation, prefill_note, usage_info, total_usage, failure_error, engine_unavailable
from edge_llm.api.serving.progress import PrefillBeats
from edge_llm.api.protocol.common import SamplingDefaults
from edge_llm.api.protocol.openai_answers import StreamHead, usage_chunk
from edge_llm.api.sse import DONE, EventStreamResponse, encode_json_event
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient
from edge_llm.engine.types import (
    EngineError,
    EngineUnavailableError,
    Failed,
    FimTokens,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)
from edge_llm.prompting.chat_template import TemplateError
from edge_llm.registry.names import same_name

logger = logging.getLogger(__name__)

T = TypeVar("T")
BodyModel = TypeVar("BodyModel", bound=BaseModel)

# A request whose body is larger than this has its tokenizer-thread work (prompt, template, grammar: seconds for a
# megabyte) done in the engine's bulk thread, so that ordinary requests never queue behind it (docs/reliability.md).
BULK_BODY_BYTES = 64 * 1024


class Serving:
    """The base of every endpoint family: the settings, the engine facade and the steps they all take."""

    def __init__(self, settings: Settings, engine: EngineClient, core: ModelCore, names: tuple[str, ...] = ()
                 ) -> None:
        """`core`: what the model's families share (its prompt builder and grammar cache: serving/core.py);
        `names`: every name of the model (api/model_routing.py resolves them); by default its id, file name and
        --model-alias."""
        self.settings = settings
        self.engine = engine
        self.core = core
        self.grammars = core.grammars
        self.defaults = SamplingDefaults(
            temperature=settings.default_temperature,
            top_p=settings.default_top_p,
            top_k=settings.default_top_k,
            max_tokens=settings.default_max_tokens,
        )
        self.model_id = settings.model_name
        self.names = names

    # ---- the model a request names ---------------------------------------------------------------

    @property
    def model_names(self) -> set[str]:
        names = {self.model_id, self.settings.model.name, *self.names}
        if not self.names:
            names.update(self.settings.alias_names)
        return names

    def answer_model(self, context: RequestContext) -> str:
        """The name answers carry in `model`: the one the request gave for this model (an alias, the file name), as
        llama-server, vLLM and Ollama echo it; the model's id when it gave none."""
        name = (context.body or {}).get("model")
        return name if isinstance(name, str) and name and same_name(name, self.model_names) else self.model_id

    def check_model(self, name: str | None) -> None:
        if name and not same_name(name, self.model_names):
            raise APIError(
                404,
                f"The model '{name}' does not exist; this server serves '{self.model_id}'",
                code="model_not_found",
                param="model",
            )

    # ---- the body --------------------------------------------------------------------------------

    @staticmethod
    async def json_body(request: Request) -> dict[str, Any]:
        """The body as a JSON object, parsed once (its size noted in the request's context: `off_loop` picks its
        thread by it)."""
        return await request_json(request)

    def parse(self, context: RequestContext, model: type[BodyModel], body: dict[str, Any]) -> BodyModel:
        """`body` validated as `model`; keys its models do not know, at any depth, are ignored and reported
        (api/params.py), or refused with `--strict-params`."""
        if "keep_alive" in body:  # Ollama's field, accepted in every body: the model router reads it
            body = {key: value for key, value in body.items() if key != "keep_alive"}
        return parse_body(context, model, body, strict=self.settings.strict_params)

    async def read(self, request: Request, model: type[BodyModel]) -> BodyModel:
        """The body parsed as `model`, and the model it names checked."""
        body = self.parse(request_context(request), model, await self.json_body(request))
        self.check_model(getattr(body, "model", None))
        return body

    # ---- the vocabulary --------------------------------------------------------------------------

    async def off_loop(self, context: RequestContext, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs in the tokenizer thread (a large request's work: in the bulk thread): vocabulary, template and
        grammar work never blocks the event loop."""
        bulk = context.body_bytes > BULK_BODY_BYTES
        run_in = self.engine.in_bulk_thread if bulk else self.engine.in_tokenizer_thread
        try:
            return await run_in(function, *args, **kwargs)
        except EngineUnavailableError as exc:
            raise engine_unavailable(exc) from None
        except TemplateError as exc:
            raise from_engine_error(exc) from None

    def check_logit_bias(self, logit_bias: dict[str, float] | None) -> None:
        try:
            for key in logit_bias or {}:
                if not self.engine.is_valid_token(int(key)):
                    raise invalid_request(
                        f"logit_bias names token id {key}, outside the vocabulary (0..{self.engine.n_vocab - 1})",
                        param="logit_bias",
                    )
        except EngineUnavailableError as exc:
            raise engine_unavailable(exc) from None

    def check_token_ids(self, tokens: list[int], param: str) -> None:
        """A 400 naming `param` for the first token id outside the vocabulary."""
        try:
            for token in tokens:
                if not self.engine.is_valid_token(token):
                    raise invalid_request(f"Token id {token} is outside the vocabulary "
                                          f"(0..{self.engine.n_vocab - 1})", param=param)
        except EngineUnavailableError as exc:
            raise engine_unavailable(exc) from None

    def plain_tokens(self, text: str) -> list[int]:
        """Text as plain text: control-token spellings in it stay text (runs in the tokenizer thread)."""
        return self.engine.tokenize(text, add_special=False, parse_special=False)

    def bos_token(self) -> int | None:
        info = self.engine.model_info
        return info.bos_token if info is not None else None

    def fim_tokens(self, param: str) -> FimTokens:
        """The model's fill-in-the-middle tokens, or a 400 that says the model has none."""
        info = self.engine.model_info
        if info is None:
            raise engine_unavailable(EngineUnavailableError("the model is not loaded yet"))
        if info.fim is None:
            raise invalid_request(f"The model '{self.model_id}' has no fill-in-the-middle tokens (FIM prefix, "
                                  "suffix and middle), so it cannot complete between a prefix and a suffix",
                                  param=param, code="fim_not_supported")
        return info.fim

    # ---- prompts in the context ------------------------------------------------------------------

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    continue_final: bool = False) -> list[int]:
        """Messages → tokens through the model's one prompt builder; a prompt that cannot fit is refused before it
        is tokenized (runs in the tokenizer thread)."""
        return self.core.chat_prompt(messages, tools, continue_final=continue_final,
                                     before_tokenizing=self.check_prompt_bytes)

    @property
    def context_limit(self) -> int:
        info = self.engine.model_info
        train = info.n_ctx_train if info is not None and info.n_ctx_train > 0 else None
        context = self.settings.sequence_context
        return min(context, train) if train else context

    def check_prompt_bytes(self, size: int) -> None:
        """Refuses a prompt of `size` bytes (UTF-8) that cannot fit, before it is tokenized (a megabyte takes
        seconds): no token stands for more bytes than the vocabulary's longest, so it has at least size / that."""
        info = self.engine.model_info
        if info is None or info.max_token_bytes <= 0:
            return
        at_least = -(-size // info.max_token_bytes)
        counted = f"at least {at_least} tokens ({size} bytes; no token of this model is longer than " \
                  f"{info.max_token_bytes} bytes)"
        cap = self.settings.max_prompt_tokens
        if cap is not None and at_least > cap:
            raise invalid_request(f"The prompt has {counted}; this server accepts at most {cap} prompt tokens",
                                  param="messages", code="context_length_exceeded")
        if at_least >= self.context_limit:
            raise invalid_request(f"This model's maximum context length is {self.context_limit} tokens; the prompt "
                                  f"has {counted} and leaves no room to generate", param="messages",
                                  code="context_length_exceeded")

    def fit(self, prompt: list[int], max_tokens: int | None) -> int:
        """The max_tokens a prompt gets: refused when it leaves no room, capped to what fits (all that fits
        when `max_tokens` is None)."""
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
        room = limit - len(prompt)
        return min(cap_max_tokens(self.settings, room if max_tokens is None else max_tokens), room)

    @property
    def cache_reuse(self) -> int:
        """The shortest cached chunk a fill-in-the-middle request may move into place; 0 when the model's KV cells
        cannot be moved."""
        info = self.engine.model_info
        return self.settings.cache_reuse if info is not None and info.can_move_cells else 0

    # ---- a request's life in the engine ------------------------------------------------------------

    def start(
        self,
        context: RequestContext,
        prompts: list[list[int]],
        *,
        n: int,
        max_tokens: int | None,
        sampling: Callable[[int], SamplingParams],
        stop: tuple[str, ...],
        logprobs: int | None,
        cache_prompt: bool = True,
        fill_in_the_middle: bool = False,
        speculative: bool = True,
    ) -> Generation:
        """Submits one engine request per choice; choices of one prompt share its prefill (see scheduler).
        Fill-in-the-middle requests may move a chunk of the previous keystroke's prompt (`--cache-reuse`)."""
        request_id = context.id
        budgets = [self.fit(prompt, max_tokens) for prompt in prompts]
        choices = len(prompts) * n
        requests = [
            GenerationRequest(
                request_id=request_id if choices == 1 else f"{request_id}/{choice}",
                prompt_tokens=prompts[choice // n],
                max_tokens=budgets[choice // n],
                sampling=self.seeded(sampling(choice % n), choice % n),
                stop=stop,
                logprobs=logprobs,
                cache_prompt=cache_prompt,
                reuse_min=self.cache_reuse if fill_in_the_middle and cache_prompt else 0,
                speculative=speculative,
            )
            for choice in range(choices)
        ]
        try:
            channel = self.engine.submit(requests)
        except EngineError as exc:
            raise from_engine_error(exc) from None
        if context.load_wait_ms:
            channel.extra_timings["load_ms"] = context.load_wait_ms
        return Generation(requests, channel, [len(p) for p in prompts], [i // n for i in range(choices)],
                          self.answer_model(context))

    def seeded(self, sampling: SamplingParams, choice: int) -> SamplingParams:
        """A request without a seed gets --seed's (plus its choice index, so that n choices differ), if set."""
        if sampling.seed is not None or self.settings.seed < 0:
            return sampling
        return replace(sampling, seed=(self.settings.seed + choice) & 0xFFFFFFFF)

    def abort(self, generation: Generation) -> None:
        for engine_request in generation.requests:
            self.engine.abort(engine_request.request_id)  # a no-op for those already finished

    @staticmethod
    def headers(generation: Generation) -> dict[str, str]:
        return {"x-request-id": generation.request_id}

    def stream(self, generation: Generation, events: AsyncIterator[bytes], headers: dict[str, str] | None = None,
               *, framing: type[EventStreamResponse] = EventStreamResponse,
               beats: PrefillBeats | None = None) -> EventStreamResponse:
        """An SSE response of `events` (or NDJSON: `framing=NdjsonResponse`); the generation is aborted when it ends
        early (a disconnect, an error). A long prefill shows as the protocol's own `beats` when it has them, as
        comment lines otherwise."""

        async def guarded() -> AsyncIterator[bytes]:
            try:
                async for chunk in events:
                    yield chunk
            finally:
                self.abort(generation)

        response = framing(
            guarded(),
            headers=headers or self.headers(generation),
            on_disconnect=lambda: self.abort(generation),
            keepalive_interval=self.settings.sse_keepalive,
        )
        if beats is not None:
            beats.attach(response)
            generation.channel.on_progress = lambda _index, progress: beats.beat(progress)
        else:
            generation.channel.on_progress = lambda index, progress: response.note(prefill_note(index, progress))
        return response

    async def collect(self, request: Request, generation: Generation) -> list[ChoiceResult]:
        """Every choice's whole answer; the generation is aborted when the client leaves first."""

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
                    self.abort(generation)
                    raise failure_error(event)
            return results

        return await self.while_connected(request, generation, gather())

    async def while_connected(self, request: Request, generation: Generation | str, work: Awaitable[T]) -> T:
        """The result of `work` (reading the answer of a generation, or of the engine request with this id); the
        engine work is aborted when the client leaves first."""
        result = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not result.done():
                if isinstance(generation, str):
                    self.engine.abort(generation)
                else:
                    self.abort(generation)
                result.cancel()
        if not result.done():
            # The client left: nobody reads this answer, but it ends the request as handled (access status
            # 499) instead of as an exception that uvicorn logs with a traceback.
            raise APIError(499, "The client closed the connection before the answer",
                           code="client_closed_request", error_type="invalid_request_error")
        return result.result()

    # ---- the OpenAI answer shapes (chat and completions) ---------------------------------------------

    @staticmethod
    def answer_usage(generation: Generation, finished: list[Finished | None]) -> dict[str, Any]:
        """The usage of a whole request in OpenAI's shape (each distinct prompt counted once)."""
        return usage_info(total_usage(generation, finished)).model_dump()

    def stream_end(self, generation: Generation, finished: list[Finished | None], include_usage: bool,
                   head: StreamHead, kind: Literal["chat.completion.chunk", "text_completion"]) -> bytes:
        """The usage chunk (empty choices; only when asked for), then the end marker."""
        if not include_usage:
            return DONE
        return encode_json_event(usage_chunk(head, kind, self.answer_usage(generation, finished))) + DONE


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
