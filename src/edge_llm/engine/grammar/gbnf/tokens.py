"""The texts of a vocabulary's tokens, sorted, so that `ambiguity` can follow only characters that begin, or go on
in, a real token: llama.cpp splits a candidate token into its characters and never looks past its end."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable

# A prefix of one or more tokens: the range [low, high) of the sorted texts that start with it, and its length.
Prefix = tuple[int, int, int]


class TokenTexts:
    def __init__(self, texts: Iterable[str]) -> None:
        self._texts = sorted({text for text in texts if text})
        self.longest = max(map(len, self._texts), default=0)

    def start(self) -> Prefix:
        return (0, len(self._texts), 0)

    def extend(self, prefix: Prefix, code: int) -> Prefix | None:
        """The prefix followed by the character `code`; None when no token goes on that way."""
        low, high, length = prefix
        char = chr(code)

        def at(text: str) -> str:
            return text[length:length + 1]

        start = bisect_left(self._texts, char, low, high, key=at)
        end = bisect_right(self._texts, char, start, high, key=at)
        return (start, end, length + 1) if start < end else None

    def __len__(self) -> int:
        return len(self._texts)
