"""Tool calls: the grammar that forces one, and the parser that finds them in model output.

Qwen2.5 (and Hermes-style templates) emit `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
Small models often leave the tags out and answer with the bare object; an answer that is only such objects
(one, or one per line, optionally in a Markdown fence) naming declared functions is taken as calls too.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # a JSON text, as OpenAI sends it

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            call["index"] = index
        return call


def _parse_call(body: str) -> ParsedToolCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall("call_" + uuid.uuid4().hex[:24], data["name"], text)


class ToolCallParser:
    """Fed the model's text as it streams; separates plain content from complete tool calls.

    With the declared function `names`, an answer whose first non-blank character opens a JSON object or a
    fence is held until it ends: if it is nothing but calls to those functions, they are its tool calls."""

    def __init__(self, names: Collection[str] = ()) -> None:
        self._buffer = ""
        self._inside = False
        self._names = frozenset(names)
        self._bare: bool | None = None if self._names else False  # None: not known yet
        self._held = ""
        self.calls: list[ParsedToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        if self._bare is not False:
            self._held += text
            start = self._held.lstrip()[:1]
            if not start or self._bare:
                return "", []
            self._bare = start in "{`"
            if self._bare:
                return "", []
            text, self._held = self._held, ""
        return self._feed_tagged(text)

    def _feed_tagged(self, text: str) -> tuple[str, list[ParsedToolCall]]:
        self._buffer += text
        content: list[str] = []
        found: list[ParsedToolCall] = []
        while True:
            if not self._inside:
                start = self._buffer.find(OPEN)
                if start < 0:
                    keep = _partial_suffix(self._buffer, OPEN)
                    content.append(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                content.append(self._buffer[:start])
                self._buffer = self._buffer[start + len(OPEN) :]
                self._inside = True
            end = self._buffer.find(CLOSE)
            if end < 0:
                break
            body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
            self._inside = False
            call = _parse_call(body)
            if call is None:
                content.append(OPEN + body + CLOSE)  # not a real call: the text goes through
            else:
                found.append(call)
        self.calls.extend(found)
        return "".join(content), found

    def finish(self) -> tuple[str, list[ParsedToolCall]]:
        """The output ended: an unclosed block is a call if it parses, else text."""
        held, self._held = self._held, ""
        if held:
            calls = _bare_calls(held, self._names)
            if calls:
                self.calls.extend(calls)
                return "", calls
            content, found = self._feed_tagged(held)
            rest, more = self._finish_tagged()
            return content + rest, found + more
        return self._finish_tagged()

    def _finish_tagged(self) -> tuple[str, list[ParsedToolCall]]:
        rest, self._buffer = self._buffer, ""
        if not self._inside:
            return rest, []
        self._inside = False
        call = _parse_call(rest.strip())
        if call is None:
            return OPEN + rest, []
        self.calls.append(call)
        return "", [call]


def _bare_calls(text: str, names: frozenset[str]) -> list[ParsedToolCall]:
    """The calls an answer of bare JSON objects makes, or [] when it is anything else."""
    body = text.strip()
    fence = re.fullmatch(r"```[a-zA-Z]*\n(.*?)\n?```", body, re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    try:
        objects = [json.loads(body)]
    except ValueError:
        try:
            objects = [json.loads(line) for line in body.splitlines() if line.strip()]
        except ValueError:
            return []
    calls = []
    for data in objects:
        if not (isinstance(data, dict) and data.get("name") in names and isinstance(data.get("arguments"), dict)):
            return []
        calls.append(ParsedToolCall("call_" + uuid.uuid4().hex[:24], data["name"],
                                    json.dumps(data["arguments"], ensure_ascii=False)))
    return calls


def _partial_suffix(text: str, marker: str) -> int:
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def forced_call_grammar(functions: list[dict[str, Any]], schema_to_grammar: Callable[[dict], str]) -> str:
    """GBNF that makes the model emit exactly one call to one of `functions` (name + typed arguments)."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
        }
        for f in functions
    ]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    call_rules = re.sub(r"\broot\b", "tool-call", schema_to_grammar(schema))
    return f'root ::= "{OPEN}\\n" tool-call "\\n{CLOSE}"\n{call_rules}'
