"""Chat templates from GGUF metadata, rendered in a Jinja2 sandbox.

The template comes from the model file, so it is untrusted code: it runs in an
`ImmutableSandboxedEnvironment` (CVE-2024-34359 is what happens otherwise).

Message text must never turn into control tokens, so rendering returns *segments*:
template text (tokenized with special-token parsing) and message content (tokenized as
plain text). Contents are swapped for unique markers while rendering, then put back.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

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


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or FALLBACK_TEMPLATE
        self.is_fallback = source is None
        self._bos = bos_token
        self._eos = eos_token
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
        )
        environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        environment.filters["tojson"] = _tojson
        try:
            self._template = environment.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[Segment]:
        nonce = uuid.uuid4().hex[:12]
        contents: dict[str, str] = {}
        masked: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            message = dict(message)
            content = message.get("content")
            if isinstance(content, str) and content:
                marker = f"\u27e6{nonce}:{index}\u27e7"
                contents[marker] = content
                message["content"] = marker
            masked.append(message)
        variables: dict[str, Any] = {
            "messages": masked,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        if tools:
            variables["tools"] = tools
        try:
            rendered = self._template.render(**variables)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"the model's chat template tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # a template is arbitrary code: any failure is a template failure
            raise TemplateError(f"the model's chat template failed: {exc}") from exc
        return _split_segments(rendered, contents, nonce)


def _split_segments(rendered: str, contents: dict[str, str], nonce: str) -> list[Segment]:
    pattern = re.compile("(\u27e6" + re.escape(nonce) + r":\d+\u27e7)")
    segments: list[Segment] = []
    for part in pattern.split(rendered):
        if not part:
            continue
        if part in contents:
            segments.append(Segment(contents[part], True))
        else:
            segments.append(Segment(part, False))
    return segments
