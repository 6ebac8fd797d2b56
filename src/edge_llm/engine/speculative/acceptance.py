"""Verifying a draft: which of its tokens the sequence's own sampler agrees with. Pure, no llama.cpp.

The batch held the sequence's pending token and its draft d1..dk at the positions after it, each in a row with
logits. The sampler draws the token after the pending one from the pending token's row; while that token equals the next draft token,
the row of that draft token holds exactly the logits the sampler would see after it, so the next token is drawn
from there, and so on. What comes out is the longest agreeing prefix of the draft plus one token of the sampler's
own (the correction, or a bonus when the whole draft was right): the tokens plain decoding would have produced,
one step each, given the same logits. The sampler accepts each drawn token as it goes (a grammar advances over
them), and never sees a token it did not draw. A sampling sampler draws once per emitted token, as without a
draft, so its output distribution (and a seeded request's draws) are unchanged: drawing x from p and keeping it
while x equals the draft token d is speculative sampling's acceptance rule for a one-guess draft (accept d with
probability p(d), else take a token from p without d).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Verified:
    tokens: list[int]  # drawn, in order: the accepted draft tokens, then the sampler's own
    # Draft tokens whose KV cells are kept: all but the last drawn token equal the draft's first tokens (the last is
    # the next one to decode, as after any sample; when it equals the next draft token too, that cell goes anyway).
    accepted: int
    error: BaseException | None = None  # drawing the token after `tokens` failed (sampling exhausted, …)


def verify(draft: Sequence[int], rows: Sequence[int], draw: Callable[[int], int],
           ends: Callable[[int], bool]) -> Verified:
    """Draws tokens from `rows` (the pending token's, then each draft token's) while they confirm `draft`; `draw(row)`
    samples one (and accepts it into the sampler), `ends(token)` says the answer ends with it (nothing is drawn
    after it)."""
    assert len(rows) == len(draft) + 1
    tokens: list[int] = []
    for position in range(len(draft) + 1):
        try:
            token = draw(rows[position])
        except Exception as exc:  # noqa: BLE001 - the caller handles it after the tokens drawn before it
            return Verified(tokens, max(0, len(tokens) - 1), exc)
        tokens.append(token)
        if position == len(draft) or token != draft[position] or ends(token):
            break
    return Verified(tokens, len(tokens) - 1)
