"""The tool-call tail of an answer, for every family that offers tools (chat, Messages, Responses, Ollama): the
grammar that forces a call, the calls found in a whole answer, and the calls found as an answer streams.

The model writes calls as text (`<tool_call>{...}</tool_call>`, or bare JSON objects naming declared functions:
prompting/tools.py parses both); a family only says how a call goes on its wire (an OpenAI `tool_calls` entry, an
Anthropic `tool_use` block, a Responses `function_call` item, an Ollama `tool_calls` entry).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from edge_llm.api.serving.grammars import Grammars
from edge_llm.prompting.tools import ParsedToolCall, ToolCallParser, forced_call_grammar


def forced_call(grammars: Grammars, functions: list[dict[str, Any]], *, param: str) -> str:
    """The checked grammar that makes the answer exactly one call to one of `functions` (a 400 naming `param` when
    it cannot be built; a function's parameters that are no valid schema name `tools`)."""
    return grammars.checked(forced_call_grammar(functions, lambda schema: grammars.to_gbnf(schema, param="tools")),
                            param=param)


class ToolCallTail:
    """One answer's calls as it streams: `feed` each piece of text, `finish` at the end; each gives back the text
    that is not a call and the calls completed in it. Without tool names the text passes through unchanged."""

    def __init__(self, names: Collection[str]) -> None:
        self._parser = ToolCallParser(names) if names else None
        self.calls: list[ParsedToolCall] = []  # every call so far, in order

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        if self._parser is None:
            return text, []
        content, calls = self._parser.feed(text)
        self.calls += calls
        return content, calls

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """What the parser still held when the answer ended: text, or the calls it completes."""
        if self._parser is None:
            return "", []
        content, calls = self._parser.finish()
        self.calls += calls
        return content, calls

    def index(self, call: ParsedToolCall) -> int:
        """The call's position among the answer's calls (OpenAI's `index`)."""
        return self.calls.index(call)


def split_calls(text: str, names: Collection[str]) -> tuple[str, list[ParsedToolCall]]:
    """A whole answer: its text without the calls, and the calls."""
    tail = ToolCallTail(names)
    head, _ = tail.feed(text)
    rest, _ = tail.finish()
    return head + rest, tail.calls
