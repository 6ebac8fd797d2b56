"""Tool calls: the grammar that forces one, and the parser that finds them in model output.

Qwen2.5 (and Hermes-style templates) emit `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
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
    """Fed the model's text as it streams; separates plain content from complete tool calls."""

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self.calls: list[ParsedToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ParsedToolCall]]:
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
        rest, self._buffer = self._buffer, ""
        if not self._inside:
            return rest, []
        self._inside = False
        call = _parse_call(rest.strip())
        if call is None:
            return OPEN + rest, []
        self.calls.append(call)
        return "", [call]


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
