"""Messages → prompt tokens: chat template segments, tokenized so that request text never becomes control tokens.

The rendered prompt is cut only where the template's own text spells one of the model's control tokens; every run
between two cuts (template text and request values together) is tokenized as plain text. That is how llama.cpp
tokenizes with special-token parsing (it cuts at control-token spellings and tokenizes the rest as text), so a
normal request gets exactly the tokens a whole-string tokenization gave, while a control-token spelling inside a
request value stays text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from edge_llm.prompting.chat_template import ChatTemplate, Segment, TemplateError


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


class PromptBuilder:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, *, bos_token: int | None,
                 control_tokens: Mapping[str, int]) -> None:
        """`control_tokens`: the model's control tokens by their text (the ones special-token parsing reads)."""
        self.template = template
        self._tokenizer = tokenizer
        self._bos = bos_token  # None when the model does not want a BOS token
        self._controls = dict(control_tokens)
        # longest first: at one position the longest spelling wins, as in llama.cpp
        texts = sorted(self._controls, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(text) for text in texts)) if texts else None

    def spells_control(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def build(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
              continue_final: bool = False, before_tokenizing: Callable[[int], None] | None = None) -> list[int]:
        """`continue_final`: the last message (an assistant's, with text) is left open, so the answer goes on from
        its text (Anthropic's prefill) instead of starting a new turn. `before_tokenizing` gets the rendered
        prompt's size in UTF-8 bytes, and may refuse it (raise) before the tokenizer spends time on it."""
        segments = self.template.render(messages, tools=tools, add_generation_prompt=not continue_final,
                                        protect=self.spells_control)
        if continue_final:
            segments = _open_final(segments)
        if before_tokenizing is not None:
            before_tokenizing(sum(len(segment.text.encode("utf-8", errors="replace")) for segment in segments))
        tokens = self._tokens(segments)
        if self._bos is not None and (not tokens or tokens[0] != self._bos):
            tokens.insert(0, self._bos)
        return tokens

    def _tokens(self, segments: list[Segment]) -> list[int]:
        tokens: list[int] = []
        run: list[str] = []  # plain text since the last control token

        def flush() -> None:
            text = "".join(run)
            run.clear()
            if text:
                tokens.extend(self._tokenizer.tokenize(text, add_special=False, parse_special=False))

        for segment in segments:
            if segment.is_content or self._pattern is None:
                run.append(segment.text)
                continue
            position = 0
            for match in self._pattern.finditer(segment.text):
                run.append(segment.text[position:match.start()])
                flush()
                tokens.append(self._controls[match.group()])
                position = match.end()
            run.append(segment.text[position:])
        flush()
        return tokens


def _open_final(segments: list[Segment]) -> list[Segment]:
    """The segments up to the last message's text: what the template writes after it (the end of the turn) goes."""
    last = max((i for i, segment in enumerate(segments) if segment.is_content), default=-1)
    if last < 0:
        raise TemplateError("the last message has no text to continue")
    return segments[: last + 1]
