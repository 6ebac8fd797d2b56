"""Greedy sampling straight from the logits, for temperature-0 requests without penalties or a grammar.

llama.cpp's sampler chain copies all 151,936 logits into a candidate array before its greedy
sampler scans them (about 0.3 ms a token here); an argmax over the logits in place costs a tenth of
that and picks the same token: the first of the highest values, after any logit_bias.
"""

from __future__ import annotations

import numpy as np


class GreedyPicker:
    def __init__(self, logit_bias: tuple[tuple[int, float], ...] = ()) -> None:
        self._bias_ids = np.array([token for token, _ in logit_bias], dtype=np.int64)
        self._bias_values = np.array([bias for _, bias in logit_bias], dtype=np.float32)
        self._bias = {int(token): float(bias) for token, bias in logit_bias}
        self._biased = frozenset(self._bias)

    def pick(self, logits: np.ndarray) -> int:
        """The token greedy sampling chooses; `logits` (the model's, one row) is never modified."""
        best = int(logits.argmax())
        if not self._biased:
            return best
        if best not in self._biased and bool((logits[self._bias_ids] + self._bias_values < logits[best]).all()):
            return best  # no bias changes the winner (the usual case: a ban on tokens that are not on top)
        biased = logits.copy()
        biased[self._bias_ids] += self._bias_values
        return int(biased.argmax())

    def likeliest(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` tokens greedy sampling ranks first and their logits after logit_bias: highest first, ties by the
        lowest id (the order in which `pick` prefers them). Which of the tokens tied with the k-th are taken is
        arbitrary."""
        biased = logits
        if self._biased:
            biased = logits.copy()
            biased[self._bias_ids] += self._bias_values
        top = np.argpartition(biased, -k)[-k:]
        values = biased[top]
        order = np.lexsort((top, -values))
        return top[order], values[order]

    def biased_logit(self, logits: np.ndarray, token: int) -> float:
        """The logit `token` was picked with: -inf when logit_bias (or a mask in `logits`) bans it."""
        return float(logits[token]) + self._bias.get(token, 0.0)

    def close(self) -> None:
        """Nothing native to free (the engine closes every sampler)."""
