"""The scheduler with a speculative draft in flight (engine/scheduling/scheduler.py: the draft rows of `step`,
`settle_draft`, `undo_step`): where the draft goes in the batch, the cells it takes and what verification gives
back. A sequence drafts only once its acceptance rate passes the gate (engine/speculative/speculation.py); these
tests start it from a rate learnt as sure (every earlier proposal right), over a prompt that repeats, so the step
after its first sample drafts. Pure, no model."""

from __future__ import annotations

import pytest

from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence
from edge_llm.engine.scheduling.step_plan import KvRemove, KvTrim, StepPlan
from edge_llm.engine.speculative.speculation import AcceptanceRate
from edge_llm.engine.speculative.step_cost import StepCost

PERIOD = list(range(1, 11))
PROMPT = PERIOD * 2  # after it and the first sample (1), the 8 tokens before match 10 tokens earlier


def drafting(s: Scheduler, request_id: str = "a", max_tokens: int = 12) -> Sequence:
    sequence = s.add(request_id, PROMPT, max_tokens, speculative=True)
    assert sequence.speculation is not None
    sequence.speculation.pooled = AcceptanceRate(accepted=10.0, reached=10.0)  # rate 1: above every gate
    return sequence


def to_first_draft(s: Scheduler, sequence: Sequence) -> StepPlan:
    """Prefills `sequence` (no draft in a step with prompt chunks), samples the pattern's next token, and takes the
    step that decodes it with a draft."""
    first = s.step()
    assert first.drafts == [] and first.prefilled_tokens == len(PROMPT)
    s.on_sampled(sequence, PERIOD[0])
    return s.step()


def test_a_draft_follows_its_decode_token_on_free_cells_that_the_step_charges() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    plan = to_first_draft(s, a)
    assert a.speculation is not None and a.speculation.in_flight == (2, 3, 4, 5, 6, 7, 8)  # CPU cost: 8 rows
    assert plan.tokens == [1, 2, 3, 4, 5, 6, 7, 8] and plan.positions == list(range(20, 28))
    assert plan.logits == [True] * 8 and plan.samples == [(a, 0)] and plan.drafts == [(a, [1, 2, 3, 4, 5, 6, 7])]
    assert a.pending_token is None  # decoded: the next one comes from the sampler
    assert a.n_past == 28 and a.kv_tokens == PROMPT + [1, 2, 3, 4, 5, 6, 7, 8]
    assert s.kv.ledger.length(a.seq_id) == 28 and s.kv_cells_used == 28


def test_the_schedulers_step_cost_decides_the_drafts_length() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0, step_cost=StepCost.linear(0.0))
    a = drafting(s)
    plan = to_first_draft(s, a)  # rows cost nothing: the whole proposal, up to max_tokens
    assert a.speculation is not None and a.speculation.in_flight == (2, 3, 4, 5, 6, 7, 8, 9, 10, 1)
    assert len(plan.tokens) == 11 and s.kv_cells_used == 31


def test_a_draft_takes_at_most_the_rows_the_batch_has_left_and_the_free_cells() -> None:
    free = StepCost.linear(0.0)  # rows cost nothing: only the batch and the cells bound the draft
    s = Scheduler(n_ctx=200, batch_size=4, parallel=2, cache_slots=0, step_cost=free)
    a = drafting(s)
    while a.phase is not Phase.DECODE:  # the prompt in chunks of 4
        assert s.step().drafts == []
    s.on_sampled(a, PERIOD[0])
    plan = s.step()
    assert plan.tokens == [1, 2, 3, 4] and s.kv_cells_used == 24
    s = Scheduler(n_ctx=30, batch_size=32, parallel=2, cache_slots=0, step_cost=free)
    b = s.add("b", [50 + i for i in range(6)], 3)
    a = drafting(s, max_tokens=8)
    s.step()
    s.on_sampled(a, PERIOD[0])
    s.on_sampled(b, 99)
    plan = s.step()  # b and a decode: 28 cells, 2 left for a's draft
    assert plan.drafts == [(a, [2, 3])] and plan.tokens == [99, 1, 2, 3] and s.free_cells == 0


def test_no_draft_in_a_step_with_a_prompt_chunk() -> None:
    s = Scheduler(n_ctx=400, batch_size=32, parallel=3, cache_slots=0)
    a = drafting(s)
    s.step()
    s.on_sampled(a, PERIOD[0])
    b = s.add("b", [50 + i for i in range(12)], 3)
    plan = s.step()  # b's whole prompt in the step: a decodes without a draft
    assert plan.admitted == [b] and plan.prefilled_tokens == 12 and plan.drafts == [] and len(plan.tokens) == 13
    assert a.speculation is not None and a.speculation.in_flight == ()
    s.on_sampled(a, PERIOD[1])
    s.on_sampled(b, 99)
    plan = s.step()  # both decode: a drafts again
    assert [q for q, _ in plan.drafts] == [a] and plan.prefilled_tokens == 0


def test_a_draft_verified_in_part_keeps_the_accepted_cells_and_trims_the_rest() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    to_first_draft(s, a)
    assert s.take_pending_ops() == []
    s.settle_draft(a, 2)
    assert a.n_past == 23 and a.kv_tokens == PROMPT + [1, 2, 3]
    assert s.kv.ledger.length(a.seq_id) == 23 and s.kv_cells_used == 23
    assert s.take_pending_ops() == [KvTrim(a.seq_id, 23)]
    assert a.speculation is not None and a.speculation.in_flight == ()
    assert (a.speculation.drafted, a.speculation.accepted) == (7, 2)
    assert a.speculation.rate(8) < 1.0  # the first wrong position was learnt
    figures = s.speculation.figures()
    assert (figures["drafted_tokens"], figures["accepted_tokens"]) == (7, 2)
    assert figures["drafted_by_position"][:8] == (1,) * 7 + (0,)
    assert figures["accepted_by_position"][:3] == (1, 1, 0)


def test_a_draft_accepted_whole_trims_nothing_and_one_refused_whole_trims_all_of_it() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    to_first_draft(s, a)
    s.settle_draft(a, 7)
    assert a.n_past == 28 and s.kv_cells_used == 28 and s.take_pending_ops() == []
    assert a.speculation is not None and a.speculation.in_flight == () and a.speculation.rate(8) == 1.0
    s.remove(a)
    s.take_pending_ops()
    b = drafting(s, "b")
    plan = to_first_draft(s, b)
    assert b.speculation is not None and plan.drafts == [(b, [1, 2, 3, 4, 5, 6, 7])]
    s.settle_draft(b, 0)
    assert b.n_past == 21 and b.kv_tokens == PROMPT + [1] and s.kv_cells_used == 21
    assert s.take_pending_ops() == [KvTrim(b.seq_id, 21)]
    assert s.speculation.figures()["accepted_tokens"] == 7


def test_settling_refuses_more_accepted_tokens_than_the_draft_had() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    to_first_draft(s, a)
    with pytest.raises(AssertionError):
        s.settle_draft(a, 8)
    plain = s.add("plain", [5, 6], 3)
    with pytest.raises(AssertionError):
        s.settle_draft(plain, 0)


def test_a_draft_of_a_sequence_that_left_is_counted_and_frees_nothing_more() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    to_first_draft(s, a)
    s.remove(a)  # cancelled while its step ran: its cells went with it
    assert s.take_pending_ops() == [KvRemove(a.seq_id)]
    s.settle_draft(a, 3)
    assert s.take_pending_ops() == [] and s.kv_cells_used == 0 and a.n_past == 28
    assert s.speculation.figures()["drafted_tokens"] == 7


def test_a_step_with_a_draft_taken_back_lets_the_draft_go_too() -> None:
    s = Scheduler(n_ctx=200, batch_size=32, parallel=2, cache_slots=0)
    a = drafting(s)
    plan = to_first_draft(s, a)
    s.undo_step(plan)
    assert (a.n_past, a.phase, a.pending_token, a.kv_tokens) == (20, Phase.DECODE, 1, PROMPT)
    assert a.speculation is not None and a.speculation.in_flight == ()
    assert s.kv_cells_used == 20 and s.take_pending_ops() == [KvTrim(a.seq_id, 20)]
