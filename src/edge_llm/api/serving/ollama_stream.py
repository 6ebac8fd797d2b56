"""Ollama's answers to /api/chat and /api/generate: the objects of a streamed answer (one per piece of text or
tool call, then a last one with `done: true` and the figures), the one object of a non-streamed answer, and the
answers of a request that only loads or unloads its model.

The figures are Ollama's, durations in nanoseconds: `total_duration` (from the request's arrival, its model's load
included), `load_duration` (the wait for the model to load; 0 when it was loaded), `prompt_eval_count` (the prompt's
tokens, those read from the prefix cache included), `prompt_eval_duration`, `eval_count` and `eval_duration`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from edge_llm.api.protocol.anthropic_answers import tool_input
from edge_llm.api.protocol.ollama_answers import (
    ChatLine,
    Figures,
    GenerateLine,
    ToolCall,
    chat_line,
    figures,
    generate_line,
    tool_call,
)
from edge_llm.api.request_context import RequestContext
from edge_llm.api.serving.outcome import Generation
from edge_llm.api.protocol.openai_answers import chat_logprobs
from edge_llm.engine.types import Failed, Finished, TextDelta, TokenLogprob
from edge_llm.api.serving.tool_calls import ToolCallTail
from edge_llm.prompting.tools import ParsedToolCall


@dataclass
class Clock:
    """When the request arrived (monotonic) and how long it waited for its model to load."""

    started_ns: int
    load_ns: int

    @classmethod
    def of(cls, context: RequestContext) -> Clock:
        return cls(int(context.started * 1_000_000_000), int(context.load_wait_ms * 1_000_000))

    def total_ns(self) -> int:
        """From the request's arrival (its wait for the model included) until now."""
        return time.monotonic_ns() - self.started_ns


@dataclass
class Piece:
    """What one step of the answer adds: text, complete tool calls, and the logprobs of its tokens."""

    text: str
    calls: list[ParsedToolCall]
    logprobs: list[TokenLogprob]


async def pieces(generation: Generation, tools: tuple[str, ...]) -> AsyncIterator[Piece | Finished | Failed]:
    """The answer as it streams; with `tools`, tool calls are taken out of the text (the tool-call tail)."""
    tail = ToolCallTail(tools)
    async for _, event in generation.channel.choice_events():
        if isinstance(event, TextDelta):
            text, calls = tail.feed(event.text)
            yield Piece(text, calls, list(event.logprobs))
        elif isinstance(event, Finished):
            if tools:
                text, calls = tail.finish()
                yield Piece(text, calls, [])
            yield event
            return
        elif isinstance(event, Failed):
            yield event
            return


class Answer:
    """The objects of one chat (`message`) or generate (`response`) answer, with the model named as requested."""

    def __init__(self, model: str, *, chat: bool, clock: Clock, prompt_tokens: int, logprobs: bool) -> None:
        self.model = model
        self.chat = chat
        self.clock = clock
        self.prompt_tokens = prompt_tokens
        self.logprobs = logprobs
        self._calls = 0  # tool calls so far: each one's `function.index`

    def piece(self, piece: Piece) -> ChatLine | GenerateLine | None:
        """A streamed object (`done: false`), or None when the piece holds nothing to send yet."""
        if not (piece.text or piece.calls or (self.logprobs and piece.logprobs)):
            return None
        return self._object(piece.text, self._tool_calls(piece.calls), piece.logprobs, done=False)

    def final(self, finished: Finished, *, context: list[int] | None = None) -> dict[str, Any]:
        """The streamed answer's last object: no text, `done: true` and the figures."""
        return {**self._object("", [], [], done=True), **self._figures(finished, context)}

    def whole(self, parts: list[Piece], finished: Finished, *, context: list[int] | None = None) -> dict[str, Any]:
        """The non-streamed answer: all its text, tool calls and logprobs in one object, with the figures."""
        calls = self._tool_calls([call for part in parts for call in part.calls])
        logprobs = [entry for part in parts for entry in part.logprobs]
        return {**self._object("".join(part.text for part in parts), calls, logprobs, done=True),
                **self._figures(finished, context)}

    def _object(self, text: str, calls: list[ToolCall], logprobs: list[TokenLogprob], *, done: bool
                ) -> ChatLine | GenerateLine:
        # Ollama's logprobs are OpenAI's chat entries.
        entries = chat_logprobs(logprobs)["content"] if self.logprobs and logprobs else None
        if self.chat:
            return chat_line(self.model, text, calls, done, entries)
        return generate_line(self.model, text, done, entries)

    def _tool_calls(self, calls: list[ParsedToolCall]) -> list[ToolCall]:
        out = []
        for call in calls:
            out.append(tool_call(call.id, self._calls, call.name, tool_input(call.arguments)))
            self._calls += 1
        return out

    def _figures(self, finished: Finished, context: list[int] | None) -> Figures:
        timings = finished.timings
        return figures(finished.reason.value, context=context, total_ns=self.clock.total_ns(),
                       load_ns=self.clock.load_ns, prompt_tokens=self.prompt_tokens,
                       prompt_ns=_ns(timings.get("prefill_ms", 0.0)), output_tokens=finished.usage.completion_tokens,
                       output_ns=_ns(timings.get("decode_ms", 0.0)))


def _ns(milliseconds: float) -> int:
    return int(milliseconds * 1_000_000)
