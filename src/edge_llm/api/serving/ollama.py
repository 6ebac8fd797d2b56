"""POST /api/chat and /api/generate: Ollama's generation API (the ollama packages, Open WebUI, Continue, Zed,
LangChain's ChatOllama, …).

It is the chat family in Ollama's dialect, an adapter around the model's core: the same prompt builder and grammar
cache (serving/core.py: `format` schemas), the same tool-call tail (serving/tool_calls.py: `tools`); /api/generate's
`suffix` is the fill-in-the-middle layout of /infill and /v1/completions (prompting/fim.py). What differs is the
wire: NDJSON streamed by default, Ollama's objects and figures (serving/ollama_stream.py), the `options` object, and Ollama's
error envelope (chosen by path in api/errors.py). The model is the one the registry resolved for the request
(api/model_routing.py: an unknown name is Ollama's 404 there), named in every answer as the request named it.

Models here do not think: `think` true (or a level) is refused as Ollama refuses it for such a model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import APIError, invalid_request
from edge_llm.api.ndjson import NdjsonResponse, encode_line
from edge_llm.api.params import report_ignored
from edge_llm.api.protocol.ollama import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions
from edge_llm.api.request_context import RequestContext, request_context
from edge_llm.api.serving.outcome import Generation, failure_error
from edge_llm.api.protocol.errors import ollama_error
from edge_llm.api.protocol.ollama_answers import done_answer
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.ollama_stream import Answer, Clock, Piece, pieces
from edge_llm.engine.types import Failed, FimTokens, Finished
from edge_llm.prompting.fim import cursor_line_split, infill_prompt, suffix_echo_stop
from edge_llm.registry.registry import ModelRegistry

logger = logging.getLogger(__name__)

OllamaContext = Callable[[str], Awaitable[list[int]]]  # the answer's text → the `context` that /api/generate returns


class OllamaServing(Serving):
    async def chat(self, request: Request) -> Response:
        context = request_context(request)
        clock = Clock.of(context)
        body = self.parse(context, OllamaChatRequest, await self.json_body(request))
        name = self._checked(context, body, body.image_path)
        if not body.messages:
            return JSONResponse(done_answer(name, chat=True, reason="load"))
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
        grammar = await self.off_loop(context, self._format_grammar, body.format_schema)
        prompt = await self.off_loop(context, self.chat_prompt, body.to_messages(), tools or None)
        answer = Answer(name, chat=True, clock=clock, prompt_tokens=len(prompt), logprobs=bool(body.logprobs))
        names = tuple(tool["function"]["name"] for tool in tools)
        generation = self._start(context, body, prompt, grammar)
        return await self._respond(request, body, generation, answer, names)

    async def generate(self, request: Request) -> Response:
        context = request_context(request)
        clock = Clock.of(context)
        body = self.parse(context, OllamaGenerateRequest, await self.json_body(request))
        name = self._checked(context, body, body.image_path)
        if body.raw and (body.template or body.system or body.context):
            raise invalid_request("raw mode does not support template, system, or context", param="raw")
        fim = self._fim_tokens(name) if body.suffix and not body.raw else None  # Ollama checks before loading
        if not body.prompt:
            return JSONResponse(done_answer(name, chat=False, reason="load"))
        report_ignored(context, self._unused(body))
        grammar = await self.off_loop(context, self._format_grammar, body.format_schema)
        stop: tuple[str, ...] = ()
        if fim is not None:
            prompt = await self.off_loop(context, self._fim_prompt, body, fim)
            stop = suffix_echo_stop(body.suffix or "")
        elif body.raw:
            prompt = await self.off_loop(context, self.engine.tokenize, body.prompt, add_special=True,
                                         parse_special=True)
        else:
            if body.context:
                self.check_token_ids(body.context, "context")
            prompt = await self.off_loop(context, self._generate_prompt, body)
        answer = Answer(name, chat=False, clock=clock, prompt_tokens=len(prompt), logprobs=bool(body.logprobs))
        generation = self._start(context, body, prompt, grammar, stop=stop, fill_in_the_middle=fim is not None)

        async def ollama_context(text: str) -> list[int]:  # Ollama's: the prompt and the answer, as tokens
            return prompt + await self.off_loop(context, self.plain_tokens, text)

        return await self._respond(request, body, generation, answer,
                                   ollama_context=None if body.raw else ollama_context)

    # ---- the request ------------------------------------------------------------------------------------------

    def _checked(self, context: RequestContext, body: OllamaChatRequest | OllamaGenerateRequest,
                 images: str | None) -> str:
        """The model's name as the request gave it, after the checks every generation request gets."""
        name = body.model or self.model_id
        if body.thinks:
            raise APIError(400, f"{_quoted(name)} does not support thinking", param="think",
                           code="thinking_not_supported")
        if images is not None:
            raise APIError(400, f"{_quoted(name)} does not support images: it is a text model without vision, so it "
                           f"cannot read the images in '{images}'", param=images, code="vision_not_supported")
        report_ignored(context, body.ignored())
        return name

    def _fim_tokens(self, name: str) -> FimTokens:
        try:
            return self.fim_tokens("suffix")
        except APIError as exc:
            exc.ollama_message = f"{name} does not support insert"  # Ollama's words for a model without FIM
            raise

    @staticmethod
    def _unused(body: OllamaGenerateRequest) -> list[str]:
        """The fields of a generate request that change nothing: the template (Ollama's own Go template language; the
        model's chat template is used), the suffix of a raw prompt (Ollama ignores it too), and what a
        fill-in-the-middle prompt has no place for."""
        unused = ["template"] if body.template else []
        if body.suffix and body.raw:
            unused.append("suffix")
        if body.suffix and not body.raw:
            unused += [field for field in ("system", "context") if getattr(body, field)]
        return unused

    def _format_grammar(self, schema: dict[str, Any] | None) -> str | None:
        """`format` (a JSON schema, or "json": any object) as a checked grammar (runs in the tokenizer thread)."""
        return None if schema is None else self.grammars.schema(schema, param="format")

    def _generate_prompt(self, body: OllamaGenerateRequest) -> list[int]:
        """The prompt (and system text) through the model's chat template, after the earlier answer's `context`;
        a model without a chat template (a base model) reads the prompt as it is, as Ollama's default template
        `{{ .Prompt }}` has it (runs in the tokenizer thread)."""
        info = self.engine.model_info
        assert info is not None  # the tokenizer thread runs only while the model is loaded
        if not info.chat_template:
            prompt = self.engine.tokenize(body.prompt or "", add_special=True, parse_special=False)
        else:
            messages = [{"role": "system", "content": body.system}] if body.system else []
            prompt = self.chat_prompt([*messages, {"role": "user", "content": body.prompt}], None)
        if not body.context:
            return prompt
        bos = self.bos_token()
        return list(body.context) + (prompt[1:] if bos is not None and prompt[:1] == [bos] else prompt)

    def _fim_prompt(self, body: OllamaGenerateRequest, fim: FimTokens) -> list[int]:
        """The prompt is the text before the cursor, the suffix the text after it (runs in the tokenizer thread)."""
        prefix, line = cursor_line_split(body.prompt or "")
        budget = body.sampling.max_tokens or self.defaults.max_tokens
        return infill_prompt(self.plain_tokens, fim, prefix=prefix, prompt=line, suffix=body.suffix or "",
                             n_predict=budget, n_ctx=self.context_limit, bos=self.bos_token())

    def _start(self, context: RequestContext, body: OllamaChatRequest | OllamaGenerateRequest, prompt: list[int],
               grammar: str | None, *, stop: tuple[str, ...] = (), fill_in_the_middle: bool = False) -> Generation:
        options = body.sampling
        return self.start(context, [prompt], n=1, max_tokens=_max_tokens(options, len(prompt)),
                          sampling=lambda _: options.sampling_params(self.defaults, grammar),
                          stop=options.stop_strings() + stop, logprobs=body.logprob_count,
                          fill_in_the_middle=fill_in_the_middle)

    # ---- the answer -------------------------------------------------------------------------------------------

    async def _respond(self, request: Request, body: OllamaChatRequest | OllamaGenerateRequest,
                       generation: Generation, answer: Answer, tools: tuple[str, ...] = (), *,
                       ollama_context: OllamaContext | None = None) -> Response:
        headers = self.headers(generation)
        if body.streams:
            return self.stream(generation, self._lines(generation, answer, tools, ollama_context), headers=headers,
                               framing=NdjsonResponse)
        whole = await self.while_connected(request, generation,
                                           self._whole(generation, answer, tools, ollama_context))
        return JSONResponse(whole, headers=headers)

    async def _lines(self, generation: Generation, answer: Answer, tools: tuple[str, ...],
                     ollama_context: OllamaContext | None) -> AsyncIterator[bytes]:
        """The streamed answer: an object per piece, the last with the figures; an engine failure midway is
        Ollama's `{"error": …}` line."""
        text: list[str] = []
        async for item in pieces(generation, tools):
            if isinstance(item, Piece):
                text.append(item.text)
                line = answer.piece(item)
                if line is not None:
                    yield encode_line(line)
            elif isinstance(item, Finished):
                tokens = await ollama_context("".join(text)) if ollama_context is not None else None
                yield encode_line(answer.final(item, context=tokens))
            elif isinstance(item, Failed):
                yield encode_line(ollama_error(failure_error(item).message))

    async def _whole(self, generation: Generation, answer: Answer, tools: tuple[str, ...],
                     ollama_context: OllamaContext | None) -> dict[str, Any]:
        parts: list[Piece] = []
        async for item in pieces(generation, tools):
            if isinstance(item, Piece):
                parts.append(item)
            elif isinstance(item, Finished):
                text = "".join(part.text for part in parts)
                tokens = await ollama_context(text) if ollama_context is not None else None
                return answer.whole(parts, item, context=tokens)
            elif isinstance(item, Failed):
                self.abort(generation)
                raise failure_error(item)
        raise AssertionError("the engine ended a request without finishing it")


async def unload(registry: ModelRegistry, name: str | None, *, chat: bool) -> dict[str, Any]:
    """An empty chat or prompt with keep_alive 0: the model is unloaded (now when idle, else when its requests end)
    without loading it first. Raises UnknownModelError."""
    entry = await registry.unload(name)
    return done_answer(name or entry.name, chat=chat, reason="unload")


def _max_tokens(options: OllamaOptions, prompt_tokens: int) -> int | None:
    """num_predict, within `num_ctx` when the request sets one (the server's context is checked by `fit`)."""
    wanted = options.max_tokens
    if options.num_ctx is None:
        return wanted
    room = options.num_ctx - prompt_tokens
    if room <= 0:
        raise invalid_request(f"The prompt has {prompt_tokens} tokens, which leaves no room to generate within "
                              f"num_ctx {options.num_ctx}", param="options.num_ctx", code="context_length_exceeded")
    return room if wanted is None else min(wanted, room)


def _quoted(name: str) -> str:
    """As Go's %q quotes a name in Ollama's messages."""
    return json.dumps(name, ensure_ascii=False)
