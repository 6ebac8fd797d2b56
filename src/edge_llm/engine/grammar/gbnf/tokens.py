"""The texts of a vocabulary's tokens, sorted, so that `ambiguity` can follow only characters that begin, or go on
in, a real token: llama.cpp splits a candidate token into its characters and never looks past its end."""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate

# A prefix of one or more tokens: the range [low, high) of the sorted texts that start with it, and its length.
Prefix = tuple[int, int, int]

# What the packed texts take per vocabulary token, at most, for the memory estimate (models/gguf_info.py): a
# vocabulary with one character beyond U+FFFF makes Python store the whole joined text at 4 bytes a character, plus
# 4 bytes of offset a token. Measured 24.4 (Qwen2.5, 151,936 tokens) and 26.6 (Gemma 3, 262,144 tokens).
BYTES_PER_TOKEN = 28


class _Packed(Sequence[str]):
    """Sorted texts kept as one string and their offsets: 150k tokens as a list of str held ~18 MB for the life of the
    server (issue 40's memory budget); packed they take the text's size and 4 bytes a token."""

    def __init__(self, ordered: list[str]) -> None:
        self._joined = "".join(ordered)
        self._ends = array("I", accumulate(map(len, ordered)))

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self._joined) + sys.getsizeof(self._ends)

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        return self._joined[self._ends[index - 1] if index else 0:self._ends[index]]


class TokenTexts:
    def __init__(self, texts: Iterable[str]) -> None:
        ordered = sorted({text for text in texts if text})
        self.longest = max(map(len, ordered), default=0)
        self._texts = _Packed(ordered)

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

    @property
    def nbytes(self) -> int:
        """The memory the texts hold (what the estimate counts as BYTES_PER_TOKEN a vocabulary token)."""
        return self._texts.nbytes
