"""Chat templates from GGUF metadata, rendered in a Jinja2 sandbox.

The template comes from the model file, so it is untrusted code: it runs in an
`ImmutableSandboxedEnvironment` (CVE-2024-34359 is what happens otherwise).

Request text must never turn into control tokens, so rendering returns *segments*: template
text and request values. Every message's text, and any other request string (names, tool
descriptions and schemas, tool-call arguments, keys) that spells a control token, is swapped
for a unique marker while rendering and put back afterwards (JSON-escaped where the template
wrote it with `tojson`); prompt.py reads control tokens only in the template's own text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Callable
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    import jinja2

# ChatML: what Qwen and many others use; the fallback for models without a template.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The chat template could not render these messages."""


@dataclass(frozen=True)
class Segment:
    text: str
    is_content: bool  # True: user-supplied text, tokenized without parsing special tokens


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_MARKER = re.compile(r"(?:\u27e6|\\u27e6)([0-9a-f]{12}):(\d+)(?:\u27e7|\\u27e7)")  # tojson(ensure_ascii=True) escapes


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # a marker written inside JSON stands for its value JSON-escaped (":j")
    dumped = json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
    return _MARKER.sub(lambda match: f"\u27e6{match.group(1)}:{match.group(2)}:j\u27e7", dumped)


class _Masker:
    """Swaps request strings for markers: message texts always (prompt.py finds the last one for a prefill), other
    strings when `protect` says they spell a control token. Leading and trailing whitespace stays outside the
    marker, so a template's trim/strip does to the marked text what it did to the value."""

    def __init__(self, nonce: str, protect: Callable[[str], bool]) -> None:
        self._nonce = nonce
        self._protect = protect
        self.values: list[str] = []
        self._markers: dict[str, str] = {}

    def mask(self, value: str) -> str:
        core = value.strip()
        if not core:
            return value
        marker = self._markers.get(core)
        if marker is None:  # the same value gets the same marker: a template comparing two of them still can
            marker = self._markers[core] = f"\u27e6{self._nonce}:{len(self.values)}\u27e7"
            self.values.append(core)
        start = value.index(core)
        return value[:start] + marker + value[start + len(core):]

    def walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask(value) if self._protect(value) else value
        if isinstance(value, dict):
            return {self.walk(key): self.walk(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self.walk(item) for item in value]
        return value

    def message(self, message: dict[str, Any]) -> dict[str, Any]:
        masked = self.walk({key: item for key, item in message.items() if key != "content"})
        content = message.get("content")
        if isinstance(content, str):
            masked["content"] = self.mask(content)
        elif "content" in message:
            masked["content"] = self.walk(content)
        return masked

    def segments(self, rendered: str) -> list[Segment]:
        pattern = re.compile("(\u27e6" + re.escape(self._nonce) + r":\d+(?::j)?\u27e7)")
        segments: list[Segment] = []
        for index, part in enumerate(pattern.split(rendered)):
            if not part:
                continue
            if index % 2 == 0:
                segments.append(Segment(part, False))
                continue
            number, _, escaped = part[14:-1].partition(":")
            value = self.values[int(number)]
            segments.append(Segment(json.dumps(value, ensure_ascii=False)[1:-1] if escaped else value, True))
        return segments


def _never(_: str) -> bool:
    return False


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or FALLBACK_TEMPLATE
        self.is_fallback = source is None
        self._bos = bos_token
        self._eos = eos_token
        # jinja2 (~35 ms of imports) is loaded by the first template compiled, not at start-up: `serve` compiles
        # the model's template on its first chat request, and the check of --chat-template only when one is given.
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
        )
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        environment.filters["tojson"] = _tojson
        try:
            self._template: jinja2.Template = environment.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        protect: Callable[[str], bool] = _never,
    ) -> list[Segment]:
        """`protect(text)`: whether a request string other than a message's text must be kept apart from the
        template's text (it spells a control token)."""
        masker = _Masker(uuid.uuid4().hex[:12], protect)
        variables: dict[str, Any] = {
            "messages": [masker.message(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        if tools:
            variables["tools"] = masker.walk(tools)
        import jinja2

        try:
            rendered = self._template.render(**variables)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"the model's chat template tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # a template is arbitrary code: any failure is a template failure
            raise TemplateError(f"the model's chat template failed: {exc}") from exc
        return masker.segments(rendered)

