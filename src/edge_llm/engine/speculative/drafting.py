"""Draft tokens by prompt lookup: pure, no llama.cpp.

A coder model's answer often repeats its input (an edited file sent back whole) or itself. The drafter looks up
the sequence's last few tokens in everything it has seen (prompt and output) and proposes the tokens that followed
them there, as llama.cpp's `ngram-simple` speculation does; the engine verifies them in its next batch
(engine/speculative/speculation.py, engine/speculative/acceptance.py). Longer n-grams are tried first: their continuations are likelier to
be right. The index is built incrementally, one dictionary entry per n-gram size and token, so a lookup costs the
same however long the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

NGRAM_SIZES = (8, 5, 3, 2)  # the longest matching one wins


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    ngram: int  # the size of the n-gram that matched (how sure the guess is)


class NgramDrafter:
    """The n-gram index of one sequence's tokens: `extend` as tokens arrive, `propose` a continuation."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError("n-gram sizes must be positive")
        self.sizes = tuple(sorted(sizes, reverse=True))
        self.tokens: list[int] = []
        # size → n-gram → the position right after its latest occurrence that has a token after it
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        history = self.tokens
        for token in tokens:
            end = len(history)  # the n-grams ending just before `token` now have a continuation
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(history[end - n:end])] = end
            history.append(token)

    def sync(self, tokens: list[int]) -> None:
        """Indexes what `tokens` (the sequence's whole history, of which the indexed tokens are a prefix) adds."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens):])

    def propose(self, limit: int) -> Draft | None:
        """Up to `limit` tokens that followed the latest earlier occurrence of the history's last n tokens (the
        longest n that has one); None when there is none."""
        history = self.tokens
        if limit <= 0:
            return None
        for n in self.sizes:
            if len(history) <= n:
                continue
            start = self._index[n].get(tuple(history[-n:]))
            if start is not None:
                return Draft(tuple(history[start:start + limit]), n)
        return None
