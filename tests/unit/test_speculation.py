"""Speculative decoding by prompt lookup: the n-gram drafter, the draft allocation, verification, the ledger's
shrink, and the engine thread verifying drafts with a scripted fake runner (no model)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from edge_llm.engine.speculative.acceptance import verify
from edge_llm.engine.speculative.drafting import NGRAM_SIZES, Draft, NgramDrafter
from edge_llm.engine.scheduling.kv_ledger import KvLedger
from edge_llm.engine.speculative.speculation import (
    MAX_DRAFT_ROWS,
    PRIOR_RATE,
    GATE_ALONE,
    GATE_BATCHED,
    AcceptanceRate,
    Speculation,
    SpeculationStats,
    allocate,
)
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost
from edge_llm.engine.scheduling.step_plan import KvTrim
from edge_llm.engine.types import Finished, FinishReason, GenerationRequest, SamplingParams, TextDelta
from edge_llm.engine.thread.worker import Engine

from .test_engine import EOG, TIMEOUT, FakeRunner, collect, last, submit, text_of

# ---- the drafter -------------------------------------------------------------------------------------


def test_drafter_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    drafter = NgramDrafter(sizes=(4, 3, 2))
    drafter.extend([1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3, 4])
    assert drafter.propose(3) == Draft((5, 6, 9), 4)
    assert drafter.propose(10) == Draft((5, 6, 9, 9, 1, 2, 3, 4), 4)  # up to the end of the history


def test_drafter_prefers_the_longest_ngram_and_the_latest_occurrence() -> None:
    drafter = NgramDrafter()
    # (7, 8) occurs twice; the 3-gram (6, 7, 8) only once, followed by 1
    drafter.extend([6, 7, 8, 1, 0, 7, 8, 2, 5, 6, 7, 8])
    assert drafter.propose(2) == Draft((1, 0), 3)
    drafter = NgramDrafter(sizes=(2,))
    drafter.extend([6, 7, 8, 1, 0, 7, 8, 2, 5, 6, 7, 8])
    assert drafter.propose(2) == Draft((2, 5), 2)  # the latest occurrence of (7, 8)


def test_drafter_finds_nothing_without_a_repeat() -> None:
    drafter = NgramDrafter()
    assert drafter.propose(4) is None
    drafter.extend([1, 2, 3, 4, 5])
    assert drafter.propose(4) is None
    assert drafter.propose(0) is None


def test_drafter_sync_indexes_only_what_is_new() -> None:
    history = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = NgramDrafter()
    drafter.sync(history[:3])
    drafter.sync(history)
    whole = NgramDrafter()
    whole.extend(history)
    assert drafter.tokens == whole.tokens
    drafter.sync(history[:4])  # nothing new
    assert len(drafter) == len(history)
    # both propose the same drafts from here on, whatever follows
    for token in [1, 4, 1, 5, 3, 1, 4]:
        drafter.sync(drafter.tokens + [token])
        whole.extend([token])
        assert [drafter.propose(limit) for limit in range(1, 5)] == [whole.propose(limit) for limit in range(1, 5)]


def test_drafter_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(sizes=())
    with pytest.raises(ValueError):
        NgramDrafter(sizes=(0, 2))


# ---- acceptance rates and the allocation --------------------------------------------------------------


def test_acceptance_rate_follows_recent_verifications() -> None:
    rate = AcceptanceRate()
    assert rate.rate == PRIOR_RATE
    rate.update(reached=8, accepted=8)
    assert rate.rate > 0.9
    for _ in range(5):
        rate.update(reached=1, accepted=0)
    assert rate.rate < 0.5


def speculation_with_rate(accepted: int, reached: int, ngram: int = 3) -> Speculation:
    speculation = Speculation()
    for _ in range(10):
        speculation.rates.setdefault(ngram, AcceptanceRate()).update(reached, accepted)
    return speculation


def speculation_at(rate: float, ngram: int = 3) -> Speculation:
    speculation = Speculation()
    speculation.rates[ngram] = AcceptanceRate(accepted=rate * 10, reached=10)
    return speculation


def test_allocation_drafts_long_when_drafts_are_accepted_and_not_at_all_when_they_fail() -> None:
    good = speculation_with_rate(16, 16)
    bad = speculation_with_rate(0, 1)
    draft = Draft(tuple(range(16)), 3)
    good_length, bad_length = allocate([(good, draft), (bad, draft)], decode_rows=2, room=64, cost=StepCost.linear(0.1))
    assert good_length >= 8
    assert bad_length == 0


def test_allocation_drafts_less_in_a_fuller_batch() -> None:
    draft = Draft(tuple(range(16)), 3)
    alone = allocate([(speculation_at(0.95), draft)], decode_rows=1, room=64, cost=StepCost.linear(0.1))[0]
    crowded = allocate([(speculation_at(0.95), draft)], decode_rows=16, room=64, cost=StepCost.linear(0.1))[0]
    assert alone > crowded > 0


def test_a_sequence_below_the_gate_does_not_draft_however_cheap_rows_are() -> None:
    draft = Draft(tuple(range(16)), 3)
    fair = speculation_at(0.85)  # pays alone, not beside other sequences
    assert GATE_ALONE <= fair.rate(3) < GATE_BATCHED
    assert allocate([(fair, draft)], decode_rows=1, room=64, cost=StepCost.linear(0.0))[0] > 0
    assert allocate([(fair, draft)], decode_rows=4, room=64, cost=StepCost.linear(0.0)) == [0]
    poor = speculation_at(0.6)
    assert allocate([(poor, draft)], decode_rows=1, room=64, cost=StepCost.linear(0.0)) == [0]


def emit(speculation: Speculation, history: list[int], tokens: list[int], ngram_limit: int = 32) -> int:
    """Runs `tokens` through one sequence's speculation as plain decoding emits them (nothing drafted, every
    proposal left out as a shadow); returns how many steps the allocation would have drafted in, alone."""
    drafting_steps = 0
    for token in tokens:
        draft = speculation.propose(history, ngram_limit)
        if draft is not None:
            if allocate([(speculation, draft)], decode_rows=1, room=32)[0]:
                drafting_steps += 1
            speculation.leave_out(draft, len(history))
        history.append(token)
    return drafting_steps


def test_a_fresh_sequence_does_not_draft_on_an_unsupported_guess() -> None:
    assert PRIOR_RATE < GATE_ALONE < GATE_BATCHED
    speculation = Speculation()
    history = list(range(40)) + list(range(10))  # the last tokens occurred before: a long continuation follows
    draft = speculation.propose(history, limit=32)
    assert draft is not None and len(draft.tokens) == 32
    assert allocate([(speculation, draft)], decode_rows=1, room=32) == [0]


def test_proposals_left_out_teach_the_rate_so_repeats_draft_after_a_few_tokens() -> None:
    speculation = Speculation()
    source = list(range(100, 160))
    history = source + [1, 2] + source[:8]  # the answer starts copying its prompt
    assert emit(speculation, history, source[8:20]) > 0  # learnt from its shadow drafts, then drafts
    assert speculation.rate(8) >= GATE_BATCHED
    assert speculation.drafted == 0  # nothing was paid to learn it


def test_proposals_that_fail_keep_the_rate_down_without_a_draft() -> None:
    speculation = Speculation()
    key = [7, 8]  # a repeated key, each time followed by a new value: its match proposes the last value
    history = key + [500]
    values = []
    for value in range(501, 541):
        values += key + [value]
    assert emit(speculation, history, values) == 0
    assert speculation.rate(2) < PRIOR_RATE and speculation.pooled.rate < PRIOR_RATE


def test_a_shadow_draft_is_checked_as_verification_would_check_it() -> None:
    speculation = Speculation()
    speculation.leave_out(Draft((1, 2, 3, 4), 5), start=10)
    history = list(range(10)) + [1, 2]
    speculation.check_shadow(history)  # two tokens so far, both right: still being checked
    assert speculation.shadow is not None and speculation.rate(5) > PRIOR_RATE
    speculation.leave_out(Draft((9, 9), 3), start=12)  # one shadow at a time
    assert speculation.shadow.draft.ngram == 5
    history += [7, 4]  # its third token is wrong: checked up to there, the fourth is never reached
    speculation.check_shadow(history)
    assert speculation.shadow is None
    expected = AcceptanceRate()
    expected.update(reached=3, accepted=2)
    assert speculation.rate(5) == pytest.approx(expected.rate)
    assert speculation.drafted == speculation.accepted == 0


def test_a_linear_step_cost_is_one_plus_the_row_cost_a_row() -> None:
    cost = StepCost.linear(0.5)
    assert [round(cost.rows(n) * 1.5, 9) for n in range(1, 14)] == [1 + 0.5 * n for n in range(1, 14)]
    assert cost(1, 5000, 3, 5000) == cost.rows(4)  # attention free


def test_the_cpu_step_cost_grows_by_groups_of_four_rows_and_with_the_cells_attended() -> None:
    cost = CPU_STEP_COST
    steps = [cost.rows(n) for n in range(1, 21)]
    assert steps == sorted(steps) and steps[0] == 1.0
    for end in (4, 8, 12, 16):  # the first row of a group costs more than the rest of it together
        assert steps[end] - steps[end - 1] > steps[end + 3] - steps[end]
    assert cost(1, 3000, 3, 9000) > cost(1, 64, 3, 192) > cost(1, 64, 0, 0)
    assert cost(1, 3000, 3, 9000) - cost(1, 3000, 0, 0) > cost(1, 64, 3, 192) - cost(1, 64, 0, 0)


def test_a_sure_draft_alone_fills_whole_groups_of_rows() -> None:
    sure = speculation_at(0.97)
    for room in (32, 10):
        length = allocate([(sure, Draft(tuple(range(32)), 3))], decode_rows=1, room=room)[0]
        assert length > 0 and (1 + length) % 4 == 0, (room, length)


def test_a_long_context_makes_drafts_shorter_or_none() -> None:
    draft = Draft(tuple(range(32)), 3)
    short = allocate([(speculation_at(0.95), draft)], decode_rows=1, room=32, cells=[64], decode_cells=64)[0]
    long = allocate([(speculation_at(0.95), draft)], decode_rows=1, room=32, cells=[6000], decode_cells=6000)[0]
    assert short > long
    fair = speculation_at(0.82)  # above the gate alone
    assert allocate([(fair, draft)], decode_rows=1, room=32, cells=[64], decode_cells=64)[0] > 0
    assert allocate([(fair, draft)], decode_rows=1, room=32, cells=[12000], decode_cells=12000) == [0]


def test_allocation_respects_room_and_the_draft_length() -> None:
    sure = speculation_with_rate(16, 16)
    lengths = allocate([(sure, Draft((1, 2, 3), 3)), (sure, Draft(tuple(range(16)), 3))], decode_rows=2, room=5,
                       cost=StepCost.linear(0.0))
    assert sum(lengths) == 5 and lengths[0] <= 3
    many = [(sure, Draft(tuple(range(32)), 3)) for _ in range(4)]
    assert sum(allocate(many, decode_rows=4, room=1000, cost=StepCost.linear(0.0))) == MAX_DRAFT_ROWS
    assert allocate([(sure, Draft((), 4))], decode_rows=1, room=10) == [0]


def test_speculation_counts_and_stats_by_position() -> None:
    speculation = Speculation()
    speculation.in_flight, speculation.in_flight_ngram = (1, 2, 3, 4), 3
    speculation.verified(2)
    assert (speculation.drafted, speculation.accepted, speculation.in_flight) == (4, 2, ())
    stats = SpeculationStats()
    stats.record(4, 2)
    stats.record(1, 1)
    assert (stats.drafted, stats.accepted) == (5, 3)
    assert stats.drafted_at[:5] == [2, 1, 1, 1, 0]
    assert stats.accepted_at[:5] == [2, 1, 0, 0, 0]


# ---- verification ----------------------------------------------------------------------------------


def drawing(tokens: list[int]):
    rows: list[int] = []

    def draw(row: int) -> int:
        rows.append(row)
        return tokens[len(rows) - 1]

    return draw, rows


def test_verify_keeps_the_agreeing_prefix_and_the_samplers_own_next_token() -> None:
    draw, rows = drawing([5, 6, 9, 1])
    result = verify((5, 6, 7), [0, 10, 11, 12], draw, lambda t: False)
    assert result.tokens == [5, 6, 9] and result.accepted == 2 and result.error is None
    assert rows == [0, 10, 11]  # the row of the last draft token is never drawn from: its context was wrong


def test_verify_whole_draft_right_gives_a_bonus_token() -> None:
    draw, rows = drawing([5, 6, 7, 8])
    result = verify((5, 6, 7), [3, 4, 5, 6], draw, lambda t: False)
    assert result.tokens == [5, 6, 7, 8] and result.accepted == 3
    assert rows == [3, 4, 5, 6]


def test_verify_without_a_draft_draws_one_token() -> None:
    draw, rows = drawing([5])
    assert verify((), [7], draw, lambda t: False).tokens == [5]
    assert rows == [7]


def test_verify_stops_at_an_end_token_even_when_the_draft_has_it() -> None:
    draw, rows = drawing([5, EOG, 1])
    result = verify((5, EOG, 1), [0, 1, 2, 3], draw, lambda t: t == EOG)
    assert result.tokens == [5, EOG] and result.accepted == 1


def test_verify_reports_an_error_after_the_tokens_drawn_before_it() -> None:
    def draw(row: int) -> int:
        if row == 2:
            raise RuntimeError("exhausted")
        return 5 + row

    result = verify((5, 6, 7), [0, 1, 2, 3], draw, lambda t: False)
    assert result.tokens == [5, 6] and result.accepted == 1 and isinstance(result.error, RuntimeError)
    failed = verify((5,), [2, 3], draw, lambda t: False)
    assert failed.tokens == [] and failed.accepted == 0 and failed.error is not None


def test_verifying_by_sampling_keeps_the_output_distribution() -> None:
    """Speculative sampling with a one-guess draft: the tokens a sampled sequence emits with a draft are distributed
    as without one. A toy model over 3 tokens whose distribution depends on the prefix; the draft is fixed (often
    wrong on purpose). 40,000 two-token answers each way, compared by a chi-square test of homogeneity (9 cells,
    8 degrees of freedom: 26.1 is the 0.999 quantile); the seed is fixed, so the test is deterministic."""
    rng = random.Random(1234)

    def distribution(prefix: tuple[int, ...]) -> list[float]:
        weights = [1.0 + ((7 * sum(prefix) + 3 * len(prefix) + token * 5) % 4) for token in range(3)]
        return [w / sum(weights) for w in weights]

    def sample(prefix: tuple[int, ...]) -> int:
        return rng.choices(range(3), weights=distribution(prefix))[0]

    draft = (2, 1)
    n = 40_000
    plain: Counter[tuple[int, int]] = Counter()
    drafted: Counter[tuple[int, int]] = Counter()
    for _ in range(n):
        first = sample(())
        plain[(first, sample((first,)))] += 1
        # rows: the pending token's (context: nothing drafted), then each draft token's (context: the draft so far)
        result = verify(draft, [0, 1, 2], lambda row: sample(draft[:row]), lambda token: False)
        tokens = result.tokens if len(result.tokens) >= 2 else result.tokens + [sample(tuple(result.tokens))]
        drafted[(tokens[0], tokens[1])] += 1
    chi_square = 0.0
    for cell in {*plain, *drafted}:
        total = plain[cell] + drafted[cell]
        expected = total / 2
        chi_square += (plain[cell] - expected) ** 2 / expected + (drafted[cell] - expected) ** 2 / expected
    assert chi_square < 26.1, (chi_square, plain, drafted)
    # and the draft was used: answers starting with its first token took their second from its row
    assert drafted[(2, 1)] > 0


# ---- the ledger --------------------------------------------------------------------------------------


def test_ledger_shrink_frees_a_rejected_draft() -> None:
    ledger = KvLedger()
    ledger.grow(0, 10)
    ledger.copy(0, 1, 6)
    ledger.grow(1, 5)
    assert ledger.used == 15
    ledger.shrink(1, 3)
    assert ledger.used == 12 and ledger.length(1) == 8
    ledger.shrink(1, 2)  # its own block is empty now
    assert ledger.used == 10 and ledger.length(1) == 6
    ledger.grow(1, 1)
    assert ledger.used == 11
    with pytest.raises(AssertionError):
        ledger.shrink(1, 2)  # cells it shares with seq 0


# ---- the engine thread with drafts -------------------------------------------------------------------


def make_engine(runner: FakeRunner, *, speculative: bool = True, parallel: int = 2) -> Engine:
    engine = Engine(lambda: runner, n_ctx=256, batch_size=64, parallel=parallel, cache_slots=2, queue_capacity=8,
                    speculative=speculative)
    runner.batch_size = 64
    engine.start()
    assert engine.wait_loaded(TIMEOUT)
    return engine


REPEATING_PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 2


def greedy(rid: str, seed: int, max_tokens: int = 40, stop=(), prompt=None, speculative=True) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt or REPEATING_PROMPT), max_tokens, SamplingParams(temperature=0.0,
                             seed=seed), tuple(stop), speculative=speculative)


def run(engine: Engine, *requests: GenerationRequest) -> list[list]:
    async def main():
        channels = [submit(engine, r) for r in requests]
        return await asyncio.gather(*(collect(c) for c in channels))

    try:
        return asyncio.run(main())
    finally:
        engine.stop(timeout=TIMEOUT)


def test_drafted_tokens_are_verified_and_the_text_is_what_plain_decoding_gives() -> None:
    # The script repeats the prompt (drafts are right), then leaves it (a draft is rejected), then repeats again.
    script = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6, 7, 99, 98, 97, 8, 9, 10, 11, 12, 13, 14, EOG]
    runner = FakeRunner({1: script, 2: script})
    events_spec, events_plain = run(make_engine(runner), greedy("a", 1), greedy("b", 2, speculative=False))
    expected = "".join(f"<{t}>" for t in script if t != EOG)
    assert text_of(events_spec) == text_of(events_plain) == expected
    spec_done, plain_done = last(events_spec), last(events_plain)
    assert isinstance(spec_done, Finished) and spec_done.reason is FinishReason.STOP
    assert spec_done.usage.completion_tokens == plain_done.usage.completion_tokens == len(script) - 1
    assert 0 < spec_done.timings["draft_n_accepted"] < spec_done.timings["draft_n"]
    assert "draft_n" not in plain_done.timings  # it opted out
    counts = [e.token_count for e in events_spec if isinstance(e, TextDelta)]
    assert counts == sorted(counts) and counts[-1] == len(script) - 1
    # drafts rode in the batches; the rejected ones were trimmed before the next decode (the KV model checks that
    # every position follows the last), and fewer steps than tokens were needed
    assert any(len(p.tokens) > len(set(p.seq_ids)) for p in runner.plans)
    assert any(isinstance(op, KvTrim) for op in runner.kv.log)
    spec_seq = runner.samplers[0].seq_id
    assert sum(1 for p in runner.plans if spec_seq in p.seq_ids) < len(script)


def test_a_stop_string_inside_an_accepted_draft_ends_the_answer_there() -> None:
    script = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6, 7, 8, EOG]
    runner = FakeRunner({1: script}, pieces={9: b"STOP"})
    (events,) = run(make_engine(runner), greedy("a", 1, stop=["STOP"]))
    assert text_of(events) == "<5><6><7><8>"
    done = last(events)
    assert done.reason is FinishReason.STOP and done.stop_sequence == "STOP"


def test_max_tokens_bounds_the_draft() -> None:
    script = list(REPEATING_PROMPT) * 3
    runner = FakeRunner({1: script})
    (events,) = run(make_engine(runner), greedy("a", 1, max_tokens=13))
    assert text_of(events) == "".join(f"<{t}>" for t in script[:13])
    assert last(events).reason is FinishReason.LENGTH
    assert runner.samplers[0].samples == 13  # never a token drawn beyond max_tokens


def test_sampled_requests_draft_too_and_speculation_off_never_drafts() -> None:
    script = list(REPEATING_PROMPT) + [EOG]
    runner = FakeRunner({1: script})
    sampled = GenerationRequest("t", list(REPEATING_PROMPT), 30, SamplingParams(temperature=0.7, seed=1))
    (events,) = run(make_engine(runner), sampled)
    assert text_of(events) == "".join(f"<{t}>" for t in REPEATING_PROMPT)
    assert last(events).timings["draft_n_accepted"] > 0
    assert runner.samplers[0].samples == len(script)  # one draw per emitted token, as without drafts
    runner = FakeRunner({1: script})
    (events,) = run(make_engine(runner, speculative=False), greedy("a", 1))
    assert "draft_n" not in last(events).timings
    assert all(len(p.tokens) == len(set(p.seq_ids)) or not all(p.logits) for p in runner.plans)


def test_engine_stats_count_drafts() -> None:
    script = list(REPEATING_PROMPT) + [EOG]
    runner = FakeRunner({1: script})
    engine = make_engine(runner)
    (events,) = run(engine, greedy("a", 1))
    stats = engine.stats()
    done = last(events)
    assert stats.drafted_tokens == done.timings["draft_n"] > 0
    assert stats.accepted_tokens == done.timings["draft_n_accepted"] > 0
    assert sum(stats.drafted_by_position) == stats.drafted_tokens
    assert sum(stats.accepted_by_position) == stats.accepted_tokens



def test_followers_sharing_a_prompt_each_draft_their_own_answer() -> None:
    script = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6, 7, 8, EOG]
    other = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 30, 31, 32, EOG]  # parts from the prompt's pattern where a's does not
    runner = FakeRunner({1: script, 2: other})
    results = run(make_engine(runner, parallel=2), greedy("a", 1), greedy("b", 2))
    for events, expected in zip(results, (script, other)):
        assert text_of(events) == "".join(f"<{t}>" for t in expected if t != EOG)
        assert last(events).timings["draft_n_accepted"] > 0
    assert any(len({s for s in plan.seq_ids}) == 2 and len(plan.tokens) > 2 for plan in runner.plans)
