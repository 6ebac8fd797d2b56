"""Messages → prompt tokens: chat template segments, tokenized so that message text never becomes control tokens."""

from __future__ import annotations

from typing import Any, Protocol

from edge_llm.prompting.chat_template import ChatTemplate


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


class PromptBuilder:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, *, bos_token: int | None) -> None:
        self.template = template
        self._tokenizer = tokenizer
        self._bos = bos_token  # None when the model does not want a BOS token

    def build(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> list[int]:
        tokens: list[int] = []
        for segment in self.template.render(messages, tools=tools):
            tokens.extend(
                self._tokenizer.tokenize(segment.text, add_special=False, parse_special=not segment.is_content)
            )
        if self._bos is not None and (not tokens or tokens[0] != self._bos):
            tokens.insert(0, self._bos)
        return tokens
