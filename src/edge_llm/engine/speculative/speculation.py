"""Speculative decoding by prompt lookup: how many draft tokens each sequence verifies in a step. Pure, no llama.cpp.

A decode step reads all the weights whatever its rows, so on a CPU a few more rows cost a fraction of a token's
time: a draft of k tokens (engine/speculative/drafting.py) is verified in the same `llama_decode` as every sequence's next
token, and the longest prefix the sampler agrees with, plus its own next token, is kept (engine/speculative/acceptance.py).

A sequence drafts only while its recent acceptance rate is above a gate (higher beside other sequences, where a row's
cost buys less; the rate is learnt from its proposals whether drafted or not), and then how many draft rows a step
verifies is decided by a cost model of the step (engine/speculative/step_cost.py: rows cost in groups of 4 on the CPU, and by the
cells they attend). A draft token at position j
is worth p^j tokens, p being the sequence's recent rate of accepted draft positions for a match of that n-gram size.
`allocate` ranks the candidate rows of the whole batch by worth and keeps the number of them that makes the most
tokens per unit of the step's cost, so a sequence whose drafts keep failing (free prose) stops drafting, a sequence
whose drafts are accepted drafts longer, and a batch full of sequences (where a row's cost is shared by more tokens)
drafts only the surest guesses.

Sampled requests (temperature > 0) speculate too, and their output distribution is unchanged: for a draft that is
one guess (a point mass q), the standard speculative-sampling rule — accept the draft token d with probability
min(1, p(d) / q(d)) = p(d), else draw from the residual p without d, renormalised — is the same as drawing from p
and comparing with d, which is what verification does (engine/speculative/acceptance.py), one draw of the request's own
sampler and seed per emitted token, as without drafts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.speculative.drafting import Draft, NgramDrafter
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost

MAX_DRAFT = 32  # draft tokens a sequence verifies in one step at most
# Draft tokens in one step at most: every row carries logits, and llama.cpp's output buffer holds the largest step's
# (n_vocab floats a row, 0.6 MB on the default model), reserved at load (config.logit_rows).
MAX_DRAFT_ROWS = 32
STATS_POSITIONS = MAX_DRAFT
# Acceptance is estimated per n-gram size with exponential forgetting: the last ~10 checked positions count. A rate is
# learnt from every proposal, drafted or not: a proposal left out of the batch is checked against the tokens the
# sequence goes on to emit (a shadow draft, at no cost), so a sequence need not pay for a guess to learn that its
# guesses fail, and one whose proposals come true drafts after a few tokens. The prior is below the gates: nothing is
# drafted on a guess no earlier proposal of the sequence supports (free JSON's first matches, a key then a value it
# does not repeat, failed 60% of the time when the prior let them draft: 0.89-0.95x at 4 clients, 2 Dec).
DECAY = 0.9
PRIOR_RATE = 0.5
PRIOR_WEIGHT = 2.0
# Below these rates a sequence does not draft at all, whatever the cost model says: a rate is an estimate from the
# last few proposals, and on a CPU whose decode is compute-bound (2 cores) a draft row costs a large part of a token's
# time, so only sure guesses pay. Measured (benchmarks/results/speculative.md): alone, drafts accepted 88% of the
# time paid (prose, 1.37x) and 54% did not (free JSON, 0.84x); beside other sequences, 94% paid (code, 4 clients,
# 1.51x) and 74-83% did not (prose at 4 and 8 clients, 0.88x).
GATE_ALONE = 0.8
GATE_BATCHED = 0.9


@dataclass
class AcceptanceRate:
    """The recent rate at which proposed positions (reached: every position before them right) were right."""

    accepted: float = PRIOR_RATE * PRIOR_WEIGHT
    reached: float = PRIOR_WEIGHT

    @property
    def rate(self) -> float:
        return self.accepted / self.reached

    def update(self, reached: int, accepted: int) -> None:
        for position in range(reached):
            self.accepted = self.accepted * DECAY + (1.0 if position < accepted else 0.0)
            self.reached = self.reached * DECAY + 1.0

    def copy(self) -> AcceptanceRate:
        return AcceptanceRate(self.accepted, self.reached)


@dataclass
class Shadow:
    """A proposal that was not drafted, checked token by token as the sequence emits the tokens it guessed."""

    draft: Draft
    start: int  # the history position its first token would take
    checked: int = 0  # its tokens compared so far


def gate(decode_rows: int) -> float:
    """The least acceptance rate at which a sequence drafts, in a step of `decode_rows` sequences."""
    return GATE_ALONE if decode_rows <= 1 else GATE_BATCHED


@dataclass
class Speculation:
    """One sequence's drafting state: its n-gram index, acceptance rates, the draft in flight, its counts."""

    drafter: NgramDrafter = field(default_factory=NgramDrafter)
    rates: dict[int, AcceptanceRate] = field(default_factory=dict)  # by n-gram size
    # Every checked position of any n-gram size: where a sequence first proposes from a match of a new size, its rate
    # starts from this, not from the prior.
    pooled: AcceptanceRate = field(default_factory=AcceptanceRate)
    shadow: Shadow | None = None
    in_flight: tuple[int, ...] = ()  # the draft in this step's batch, verified after the decode
    in_flight_ngram: int = 0
    drafted: int = 0  # draft tokens verified so far
    accepted: int = 0

    def rate(self, ngram: int) -> float:
        return self.rate_of(ngram).rate

    def rate_of(self, ngram: int) -> AcceptanceRate:
        rate = self.rates.get(ngram)
        if rate is None:
            rate = self.rates[ngram] = self.pooled.copy()
        return rate

    def propose(self, history: list[int], limit: int) -> Draft | None:
        """The draft that could follow `history` (its last token the one decoded this step), after the shadow draft
        has been checked against what `history` added."""
        self.check_shadow(history)
        self.drafter.sync(history)
        return self.drafter.propose(min(limit, MAX_DRAFT))

    def leave_out(self, draft: Draft, start: int) -> None:
        """`draft` was not drafted: it becomes the shadow draft, unless one is still being checked."""
        if self.shadow is None:
            self.shadow = Shadow(draft, start)

    def check_shadow(self, history: list[int]) -> None:
        """Learns from the shadow draft's tokens that `history` now holds: right ones while they agree, then the
        first wrong one (as verification would have)."""
        shadow = self.shadow
        if shadow is None:
            return
        rate = self.rate_of(shadow.draft.ngram)
        tokens = shadow.draft.tokens
        while shadow.checked < len(tokens) and shadow.start + shadow.checked < len(history):
            right = history[shadow.start + shadow.checked] == tokens[shadow.checked]
            rate.update(1, int(right))
            self.pooled.update(1, int(right))
            shadow.checked += 1
            if not right:
                self.shadow = None
                return
        if shadow.checked == len(tokens):
            self.shadow = None

    def verified(self, accepted: int) -> None:
        """The draft in flight was verified: its first `accepted` tokens were right."""
        drafted = len(self.in_flight)
        reached = min(accepted + 1, drafted)  # positions checked: the accepted ones and the first wrong one
        self.rate_of(self.in_flight_ngram).update(reached, accepted)
        self.pooled.update(reached, accepted)
        self.drafted += drafted
        self.accepted += accepted
        self.in_flight = ()


def allocate(candidates: list[tuple[Speculation, Draft]], decode_rows: int, room: int,
             cost: StepCost = CPU_STEP_COST, cells: list[int] | None = None, decode_cells: int = 0) -> list[int]:
    """How many tokens of each candidate draft go into this step (0: none), given the step's `decode_rows` (their
    sequences holding `decode_cells` cells) and at most `room` draft rows; `cells[i]`: the cells candidate i's
    sequence holds (its draft rows attend them). The candidate rows, best worth first (a sequence's position j only
    after its j - 1), are kept up to the count that makes the most expected tokens per unit of the step's cost."""
    lengths = [0] * len(candidates)
    cells = cells if cells is not None else [0] * len(candidates)
    rates = [spec.rate(draft.ngram) for spec, draft in candidates]
    least = gate(decode_rows)
    heap = [(-rate, i, 1) for i, rate in enumerate(rates) if candidates[i][1].tokens and rate >= least]
    heapq.heapify(heap)
    ranked: list[int] = []  # the candidate each row belongs to, best worth first
    tokens = float(decode_rows)
    draft_cells = 0
    best_value, best_count = tokens / cost(decode_rows, decode_cells, 0, 0), 0
    while heap and len(ranked) < min(room, MAX_DRAFT_ROWS):
        negative_worth, i, position = heapq.heappop(heap)
        ranked.append(i)
        tokens -= negative_worth
        draft_cells += cells[i]
        value = tokens / cost(decode_rows, decode_cells, len(ranked), draft_cells)
        if value > best_value:
            best_value, best_count = value, len(ranked)
        if position < len(candidates[i][1].tokens):
            heapq.heappush(heap, (negative_worth * rates[i], i, position + 1))
    for i in ranked[:best_count]:
        lengths[i] += 1
    return lengths


class SpeculationStats:
    """Engine-wide counters (ints replaced whole, readable from any thread): drafted and accepted tokens, and by
    draft position (1-based) how often a drafted token there was accepted."""

    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0
        self.drafted_at = [0] * STATS_POSITIONS
        self.accepted_at = [0] * STATS_POSITIONS

    def figures(self) -> dict[str, Any]:
        """The counters as `EngineStats` names them."""
        return {"drafted_tokens": self.drafted, "accepted_tokens": self.accepted,
                "drafted_by_position": tuple(self.drafted_at), "accepted_by_position": tuple(self.accepted_at)}

    def record(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        for position in range(min(drafted, STATS_POSITIONS)):
            self.drafted_at[position] += 1
            if position < accepted:
                self.accepted_at[position] += 1
