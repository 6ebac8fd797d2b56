"""Messages → prompt tokens: chat template segments, tokenized so that message text never becomes control tokens."""

from __future__ import annotations

from typing import Any, Protocol

from edge_llm.prompting.chat_template import ChatTemplate, Segment, TemplateError


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


class PromptBuilder:
    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, *, bos_token: int | None) -> None:
        self.template = template
        self._tokenizer = tokenizer
        self._bos = bos_token  # None when the model does not want a BOS token

    def build(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
              continue_final: bool = False) -> list[int]:
        """`continue_final`: the last message (an assistant's, with text) is left open, so the answer goes on from
        its text (Anthropic's prefill) instead of starting a new turn."""
        segments = self.template.render(messages, tools=tools, add_generation_prompt=not continue_final)
        if continue_final:
            segments = _open_final(segments)
        tokens: list[int] = []
        for segment in segments:
            tokens.extend(
                self._tokenizer.tokenize(segment.text, add_special=False, parse_special=not segment.is_content)
            )
        if self._bos is not None and (not tokens or tokens[0] != self._bos):
            tokens.insert(0, self._bos)
        return tokens


def _open_final(segments: list[Segment]) -> list[Segment]:
    """The segments up to the last message's text: what the template writes after it (the end of the turn) goes."""
    last = max((i for i, segment in enumerate(segments) if segment.is_content), default=-1)
    if last < 0:
        raise TemplateError("the last message has no text to continue")
    return segments[: last + 1]
