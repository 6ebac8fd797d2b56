"""The batch scheduler (engine/scheduling/scheduler.py), driven as the engine drives it."""

from __future__ import annotations

import pytest

from edge_llm.engine.scheduling.scheduler import RequestTooLargeError, Scheduler
from edge_llm.engine.scheduling.sequence import Phase
from edge_llm.engine.scheduling.step_plan import KvCopy, KvRemove
from edge_llm.engine.scheduling.token_match import common_prefix_length

from .scheduler_model import Driver


def kv_tokens(s: Scheduler) -> int:
    """Positions held by running sequences and cache entries, each counted on its own (shared cells once each)."""
    return sum(q.n_past for q in s.running) + sum(len(e.tokens) for e in s.cache.values())


def make(n_ctx: int = 1000, batch_size: int = 64, parallel: int = 4, cache_slots: int = 0) -> Driver:
    return Driver(Scheduler(n_ctx=n_ctx, batch_size=batch_size, parallel=parallel, cache_slots=cache_slots))


def seq_tokens(plan, seq_id):
    return [t for t, s in zip(plan.tokens, plan.seq_ids) if s == seq_id]


# ---- add --------------------------------------------------------------------------------------


def test_add_validates_the_request() -> None:
    s = Scheduler(n_ctx=100, batch_size=16, parallel=2, cache_slots=0)
    with pytest.raises(ValueError):
        s.add("empty", [], 10)
    with pytest.raises(RequestTooLargeError):
        s.add("big", [1] * 90, 11)
    with pytest.raises(RequestTooLargeError):
        s.add("zero", [1], 0)
    assert issubclass(RequestTooLargeError, ValueError)
    exact = s.add("exact", [1] * 90, 10)  # exactly n_ctx fits
    assert exact.reserved == 100
    assert list(s.waiting) == [exact]
    assert len(s.running) + len(s.waiting) == 1


def test_add_copies_the_prompt() -> None:
    s = Scheduler(n_ctx=100, batch_size=16, parallel=2, cache_slots=0)
    prompt = [1, 2, 3]
    seq = s.add("a", prompt, 5)
    prompt.append(4)
    assert seq.prompt == [1, 2, 3]


def test_common_prefix_length() -> None:
    assert common_prefix_length((1, 2, 3), [1, 2, 4]) == 2
    assert common_prefix_length((), [1]) == 0
    assert common_prefix_length((1, 2), [1, 2, 3]) == 2
    assert common_prefix_length((5,), [1]) == 0


# ---- admission --------------------------------------------------------------------------------


def test_fifo_admission_and_parallel_limit() -> None:
    d = make(parallel=2)
    a, b, c, e = (d.s.add(name, [i + 1] * 3, 5) for i, name in enumerate("abce"))
    plan = d.step()
    assert plan.admitted == [a, b]
    assert d.s.running == [a, b]
    assert list(d.s.waiting) == [c, e]
    assert a.seq_id != b.seq_id
    assert c.phase is Phase.WAITING
    d.check_invariants()
    # a slot frees: the oldest waiting one gets it
    d.finish(a, keep_in_cache=False)
    plan = d.step()
    assert plan.admitted == [c]
    assert list(d.s.waiting) == [e]
    assert len(d.s.running) == 2
    d.check_invariants()


def test_request_that_cannot_fit_yet_waits_and_nothing_overtakes_it() -> None:
    d = make(n_ctx=100, batch_size=64, parallel=4)
    a = d.s.add("a", [1] * 60, 30)  # holds 60 cells once prefilled
    b = d.s.add("b", [2] * 50, 10)  # its 50-token prompt does not fit next to a's 60
    c = d.s.add("c", [3] * 2, 3)  # would fit, but must not overtake b
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [a]
    for _ in range(5):
        d.step(finish_at_max=False)
        assert b.phase is Phase.WAITING and c.phase is Phase.WAITING
        assert d.s.running == [a]
        d.check_invariants()
    assert d.s.kv_cells_used == a.n_past
    assert list(d.s.waiting) == [b, c]
    d.finish(a, keep_in_cache=False)
    plan = d.step()
    assert plan.admitted == [b, c]
    d.check_invariants()


def test_cells_are_charged_as_they_are_filled_not_for_max_tokens() -> None:
    """max_tokens 90 each would reserve 3 × 100 cells; filled cells are what count, so all three run."""
    d = make(n_ctx=200, batch_size=64, parallel=3)
    seqs = [d.s.add(f"r{i}", [i + 1] * 10, 90) for i in range(3)]
    plan = d.step(finish_at_max=False)
    assert plan.admitted == seqs
    assert d.s.kv_cells_used == 30  # the prompts
    d.step(finish_at_max=False)
    assert d.s.kv_cells_used == 33  # and each first sampled token
    d.check_invariants()


def test_cells_in_use_never_exceed_context() -> None:
    d = make(n_ctx=64, batch_size=16, parallel=3)
    seqs = [d.s.add(f"r{i}", [i + 1] * (3 + i % 5), 4 + (i * 7) % 13) for i in range(12)]
    for _ in range(500):
        if d.s.idle():
            break
        d.step()
        d.check_invariants()
        assert d.s.kv_cells_used <= 64
    assert d.s.idle()
    assert {q.request_id for q in d.finished} == {q.request_id for q in seqs}
    assert all(len(d.output[q.request_id]) == q.max_tokens for q in seqs)


# ---- prefill, decode and sampling points ------------------------------------------------------------


def test_long_prompt_is_prefilled_in_batch_size_chunks() -> None:
    d = make(batch_size=8, parallel=2)
    prompt = list(range(100, 120))  # 20 tokens: chunks of 8, 8 and 4, the last token in the last chunk
    a = d.s.add("a", prompt, 3)
    plans = [d.step(finish_at_max=False) for _ in range(3)]
    assert [len(p.tokens) for p in plans] == [8, 8, 4]
    assert [p.prefilled_tokens for p in plans] == [8, 8, 4]
    assert sum((p.tokens for p in plans), []) == prompt
    assert sum((p.positions for p in plans), []) == list(range(20))
    # logits only on the prompt's last row, sampled in the step that computes it
    assert [p.logits for p in plans] == [[False] * 8, [False] * 8, [False] * 3 + [True]]
    assert [p.samples for p in plans] == [[], [], [(a, 3)]]
    assert a.phase is Phase.DECODE and a.n_past == 20 and a.generated == 1
    plan = d.step(finish_at_max=False)  # the sampled token is decoded next
    assert (plan.tokens, plan.positions, plan.logits) == ([1000], [20], [True])
    assert plan.prefilled_tokens == 0 and plan.samples == [(a, 0)]


def test_a_chunk_cut_short_before_the_last_prompt_token_leaves_it_to_the_decode_part() -> None:
    d = make(batch_size=8, parallel=2)
    a = d.s.add("a", list(range(100, 109)), 3)  # 9 tokens: the first chunk holds 8 of them
    plan = d.step(finish_at_max=False)
    assert plan.tokens == list(range(100, 108)) and plan.samples == [] and not any(plan.logits)
    assert a.phase is Phase.PREFILL and a.n_past == 8 and a.will_decode()
    plan = d.step(finish_at_max=False)
    assert (plan.tokens, plan.positions, plan.logits, plan.prefilled_tokens) == ([108], [8], [True], 0)
    assert plan.samples == [(a, 0)] and a.phase is Phase.DECODE


def test_decode_token_follows_the_prompt_at_the_next_position() -> None:
    d = make(batch_size=16)
    a = d.s.add("a", [5, 6, 7], 3)
    plan = d.step()
    assert (plan.tokens, plan.logits) == ([5, 6, 7], [False, False, True])  # the prompt, sampled at its last token
    assert plan.samples == [(a, 2)]
    assert a.pending_token == 1000 and a.generated == 1  # sampled, decoded in the next step
    plan = d.step()
    assert plan.tokens == [1000]
    assert plan.positions == [3]
    assert plan.logits == [True]
    assert plan.samples == [(a, 0)]
    assert a.kv_tokens == [5, 6, 7, 1000]
    plan = d.step()  # third sample reaches max_tokens and finishes
    assert plan.tokens == [1001] and plan.positions == [4]
    assert d.output["a"] == [1000, 1001, 1002]
    assert d.s.idle()


def test_no_decode_token_for_a_sequence_that_has_not_been_sampled() -> None:
    s = Scheduler(n_ctx=100, batch_size=16, parallel=2, cache_slots=0)
    a = s.add("a", [1, 2, 3], 5)
    plan = s.step()
    assert plan.tokens == [1, 2, 3] and plan.samples == [(a, 2)]  # the prompt's last token needs no sample
    assert a.phase is Phase.DECODE and a.pending_token is None
    assert s.step().empty  # nothing sampled yet: nothing to decode


def test_decode_tokens_come_first_and_are_never_starved_by_a_prefill() -> None:
    d = make(batch_size=8, parallel=3)
    a = d.s.add("a", [1, 2], 30)
    d.step(finish_at_max=False)  # a's prompt, sampled at its last token
    assert a.generated == 1
    b = d.s.add("b", list(range(200, 240)), 30)  # 40-token prompt
    c = d.s.add("c", list(range(300, 310)), 30)
    b_chunks = []
    for step in range(10):
        plan = d.step(finish_at_max=False)
        # a's decode token is always first and always there
        assert plan.seq_ids[0] == a.seq_id
        assert plan.logits[0] is True
        assert seq_tokens(plan, a.seq_id) == plan.tokens[:1]
        assert len(plan.tokens) <= 8
        b_chunks.append(seq_tokens(plan, b.seq_id))
        if b.phase is Phase.DECODE and c.phase is Phase.DECODE:
            break
    # b's prompt was prefilled in chunks of batch_size - 1 (one slot taken by a's decode token)
    assert b_chunks[:6] == [list(range(200 + 7 * i, 207 + 7 * i)) for i in range(5)] + [list(range(235, 240))]
    loop_plans = d.plans[1:]
    # c waited for b's prefill (FIFO among prefills) and took the room left in the step that finished it
    assert [seq_tokens(p, c.seq_id) for p in loop_plans[:5]] == [[]] * 5
    plan = loop_plans[5]
    assert seq_tokens(plan, c.seq_id) == [300, 301]
    # b's last prompt token closes its last chunk, with logits, and is sampled in that step
    assert plan.samples == [(a, 0), (b, 5)] and (plan.tokens[5], plan.positions[5]) == (239, 39)
    assert plan.logits == [True] + [False] * 4 + [True, False, False]
    # next step: b's first sampled token right after a's token, before c's next chunk
    plan = loop_plans[6]
    assert plan.seq_ids[:2] == [a.seq_id, b.seq_id] and plan.positions[1] == 40
    assert seq_tokens(plan, c.seq_id) == list(range(302, 308))
    # and one step later c's chunk ends its prompt behind a's and b's decode tokens
    plan = loop_plans[7]
    assert plan.seq_ids == [a.seq_id, b.seq_id, c.seq_id, c.seq_id]
    assert (plan.tokens[2:], plan.positions[2:], plan.logits) == ([308, 309], [8, 9], [True, True, False, True])
    assert plan.samples == [(a, 0), (b, 1), (c, 3)]
    assert a.generated == step + 2 == 9


def test_several_sequences_prefill_in_one_step_and_get_one_sample_each() -> None:
    d = make(batch_size=32, parallel=3)
    seqs = [d.s.add(str(i), [10 * i + k for k in range(1, 4 + i)], 2) for i in range(3)]
    plan = d.step(finish_at_max=False)
    assert plan.admitted == seqs
    assert plan.tokens == sum((q.prompt for q in seqs), [])  # 3 + 4 + 5 tokens
    assert plan.seq_ids == [seqs[0].seq_id] * 3 + [seqs[1].seq_id] * 4 + [seqs[2].seq_id] * 5
    # one sample each, at each prompt's last row, in the step that computes the prompts
    assert plan.samples == [(seqs[0], 2), (seqs[1], 6), (seqs[2], 11)]
    assert [i for i, wanted in enumerate(plan.logits) if wanted] == [2, 6, 11]
    # the next step decodes the three sampled tokens together
    plan = d.step(finish_at_max=False)
    assert plan.seq_ids == [q.seq_id for q in seqs]
    assert plan.positions == [3, 4, 5]
    assert plan.samples == [(q, i) for i, q in enumerate(seqs)]


def test_steps_to_the_first_token_of_prompts_prefilled_together() -> None:
    """Eight prompts of 330 tokens in steps of 512 (the worked example of docs/performance.md): each first token is
    sampled in the step whose chunk ends its prompt, not a step later."""
    d = make(n_ctx=8192, batch_size=512, parallel=8)
    seqs = [d.s.add(str(i), [i * 1000 + k for k in range(330)], 20) for i in range(8)]
    first_token_step: dict[str, int] = {}
    for step in range(1, 12):
        d.step(finish_at_max=False)
        for q in seqs:
            if q.generated and q.request_id not in first_token_step:
                first_token_step[q.request_id] = step
        if len(first_token_step) == len(seqs):
            break
    # 2,640 prompt tokens: steps 1-5 compute them (the decode rows of earlier prompts take room from step 2 on)
    assert [first_token_step[q.request_id] for q in seqs] == [1, 2, 2, 3, 4, 4, 5, 6]
    d.check_invariants()


def entries(plan, seq_id):
    """(token, position, logits) of every batch entry of one sequence."""
    rows = zip(plan.tokens, plan.positions, plan.seq_ids, plan.logits)
    return [(token, pos, logits) for token, pos, s, logits in rows if s == seq_id]


def test_the_last_prompt_token_is_sampled_where_it_is_computed_or_alone_when_the_rest_is_in_the_kv_cache() -> None:
    """The rule: the chunk that reaches a prompt's end carries its last token with logits, sampled in that step; a
    sequence that holds prompt[:-1] already (copied from the cache, or nothing to hold) decodes prompt[-1] in the
    decode part, at position len(prompt)-1 with logits, in the step that admits it."""
    d = make(batch_size=64, parallel=4, cache_slots=2)
    prompt = list(range(1, 11))
    computed = d.s.add("computed", prompt, 1)
    plan = d.step()  # its first sample, then it finishes (max_tokens=1) into the cache
    assert plan.samples == [(computed, 9)]
    assert entries(plan, computed.seq_id) == [(token, token - 1, token == 10) for token in prompt]
    assert d.s.cache[computed.seq_id].tokens == tuple(prompt)

    cached = d.s.add("cached", prompt, 2)  # prompt[:-1] comes from the cache
    single = d.s.add("single", [42], 2)  # prompt[:-1] is empty
    fresh = d.s.add("fresh", [50, 51, 52], 2)  # all of it must be computed
    plan = d.step()
    assert plan.admitted == [cached, single, fresh]
    assert plan.kv_ops == [KvCopy(computed.seq_id, cached.seq_id, 9)]
    assert cached.phase is single.phase is fresh.phase is Phase.DECODE
    # decode part first, then fresh's chunk: all three sampled in the step that admits them
    assert plan.samples == [(cached, 0), (single, 1), (fresh, 4)]
    assert entries(plan, cached.seq_id) == [(10, 9, True)]
    assert entries(plan, single.seq_id) == [(42, 0, True)]
    assert entries(plan, fresh.seq_id) == [(50, 0, False), (51, 1, False), (52, 2, True)]
    plan = d.step()  # the three sampled tokens, right after the prompts
    assert plan.seq_ids == [cached.seq_id, single.seq_id, fresh.seq_id]
    assert plan.positions == [10, 1, 3]
    d.run()
    assert d.output == {"computed": [1000], "cached": [1000, 1001], "single": [1000, 1001], "fresh": [1000, 1001]}
    d.check_invariants()


def test_follower_sharing_all_but_the_last_prompt_token_goes_straight_to_decode() -> None:
    d = make(batch_size=8, parallel=2)
    leader = d.s.add("leader", list(range(1, 21)), 2)
    follower = d.s.add("follower", list(range(1, 11)), 2)  # shares 9 = len(prompt) - 1 positions
    for _ in range(2):
        plan = d.step(finish_at_max=False)
        assert follower.leader is leader and follower.shared == 9
        assert entries(plan, follower.seq_id) == [] and plan.samples == []
    # the leader holds 16 positions now: the follower copies 9 and decodes its last token in the same step
    plan = d.step(finish_at_max=False)
    assert plan.kv_ops == [KvCopy(leader.seq_id, follower.seq_id, 9)]
    assert follower.leader is None and follower.cached_tokens == 9
    assert entries(plan, follower.seq_id) == [(10, 9, True)]
    # the leader's last prefill chunk comes after the decode part, and ends its prompt: both are sampled
    assert entries(plan, leader.seq_id) == [(17, 16, False), (18, 17, False), (19, 18, False), (20, 19, True)]
    assert plan.samples == [(follower, 0), (leader, 4)]
    plan = d.step(finish_at_max=False)
    assert entries(plan, follower.seq_id) == [(1000, 10, True)]
    assert entries(plan, leader.seq_id) == [(1000, 20, True)]


def test_without_the_last_token_in_its_chunk_it_is_decoded_in_a_step_of_its_own() -> None:
    """--deterministic's layout (worker.py: a KV stream per sequence): chunks stop before the prompt's last token,
    which the next step decodes in its decode part, as when the rest of the prompt came from the cache."""
    d = Driver(Scheduler(n_ctx=1000, batch_size=64, parallel=2, cache_slots=0, last_token_in_chunk=False))
    a = d.s.add("a", [5, 6, 7], 3)
    plan = d.step()
    assert (plan.tokens, plan.logits, plan.samples) == ([5, 6], [False, False], [])
    assert a.phase is Phase.PREFILL and a.will_decode()
    plan = d.step()
    assert (plan.tokens, plan.positions, plan.logits, plan.samples) == ([7], [2], [True], [(a, 0)])
    d.run()
    assert d.output == {"a": [1000, 1001, 1002]}


def test_a_step_taken_back_leaves_its_sequences_as_it_found_them() -> None:
    """Every request of a step was cancelled while it decoded (worker._decode): the step is taken back, so what each
    sequence holds, and would leave in the cache, is what the KV cache holds; laid out again it is the same step."""
    d = make(batch_size=16, parallel=2)
    a = d.s.add("a", [1, 2, 3], 5)
    d.step(finish_at_max=False)  # a's prompt, sampled: 1000
    b = d.s.add("b", [7, 8, 9], 5)
    plan = d.s.step()  # a decodes 1000; b's chunk ends its prompt
    assert plan.samples == [(a, 0), (b, 3)] and b.phase is Phase.DECODE
    d.s.undo_step(plan)
    assert (a.phase, a.n_past, a.pending_token, a.kv_tokens) == (Phase.DECODE, 3, 1000, [1, 2, 3])
    assert (b.phase, b.n_past, b.pending_token, b.kv_tokens) == (Phase.PREFILL, 0, None, [])
    again = d.step(finish_at_max=False)
    assert (again.tokens, again.positions, again.logits) == (plan.tokens, plan.positions, plan.logits)
    assert again.samples == [(a, 0), (b, 3)]
    d.check_invariants()
    d.check_coherent()


def test_a_batch_smaller_than_parallel_is_refused() -> None:
    # Every running sequence's decode token must fit in one batch: sequences that go straight to
    # decode (one-token prompts, prompt[:-1] reused) take no prefill room, so the rule is enforced up front.
    with pytest.raises(ValueError, match="batch_size"):
        Scheduler(n_ctx=4096, batch_size=4, parallel=6, cache_slots=0)


def test_cancel_during_prefill_frees_the_seq_id() -> None:
    d = make(batch_size=4, parallel=1)
    a = d.s.add("a", list(range(1, 11)), 5)
    d.step()
    assert a.phase is Phase.PREFILL and a.n_past == 4
    seq_id = a.seq_id
    d.s.remove(a)
    assert d.s.running == []
    assert d.flush_ops() == [KvRemove(seq_id)]
    assert seq_id in d.s.kv.free_ids
    d.check_invariants()
    # the slot is reusable at once
    b = d.s.add("b", [7, 8], 2)
    plan = d.step()
    assert plan.admitted == [b] and b.seq_id == seq_id
    assert plan.tokens == [7, 8] and b.phase is Phase.DECODE


def test_cancel_during_decode_emits_kv_remove_in_the_next_plan() -> None:
    d = make(parallel=2)
    a = d.s.add("a", [1, 2, 3], 10)
    b = d.s.add("b", [4, 5, 6], 10)
    d.step(finish_at_max=False)
    d.step(finish_at_max=False)
    assert a.phase is Phase.DECODE
    seq_id = a.seq_id
    d.s.remove(a, keep_in_cache=False)
    plan = d.step(finish_at_max=False)
    assert plan.kv_ops == [KvRemove(seq_id)]
    assert plan.seq_ids == [b.seq_id]
    assert seq_id not in d.kv.seqs
    d.check_invariants()


def test_remove_twice_does_not_free_a_seq_id_twice() -> None:
    d = make(parallel=2, cache_slots=2)
    a = d.s.add("a", [1, 2, 3], 10)
    d.step(finish_at_max=False)
    d.s.remove(a, keep_in_cache=False)
    d.s.remove(a, keep_in_cache=False)
    d.s.remove(a, keep_in_cache=True)
    assert d.flush_ops() == [KvRemove(a.seq_id)]
    d.check_invariants()


def test_remove_with_keep_in_cache_but_no_cache_slots_frees_the_seq() -> None:
    d = make(parallel=2, cache_slots=0)
    a = d.s.add("a", [1, 2, 3], 2)
    d.run()
    assert a in d.finished
    assert d.s.cache == {}
    assert d.flush_ops() == [KvRemove(a.seq_id)]
    d.check_invariants()


# ---- prefix cache ---------------------------------------------------------------------------------


def test_finished_sequence_is_kept_as_a_cache_entry() -> None:
    d = make(parallel=2, cache_slots=2)
    a = d.s.add("a", [1, 2, 3, 4], 3)
    d.run()
    assert list(d.s.cache) == [a.seq_id]
    entry = d.s.cache[a.seq_id]
    # prompt + the generated tokens that were decoded (the last sample never is)
    assert entry.tokens == (1, 2, 3, 4, 1000, 1001)
    assert d.flush_ops() == []  # nothing freed
    d.check_cache()
    d.check_invariants()
    assert d.s.kv_cells_used == 6


def test_shared_prefix_is_copied_from_the_cache() -> None:
    d = make(parallel=2, cache_slots=2)
    a = d.s.add("a", [1, 2, 3, 4], 3)
    d.run()
    b = d.s.add("b", [1, 2, 3, 9, 9], 2)
    plan = d.step()
    assert plan.admitted == [b]
    assert plan.kv_ops == [KvCopy(a.seq_id, b.seq_id, 3)]
    assert b.cached_tokens == 3
    # only the rest of the prompt is decoded, from position 3 on, sampled at its last token
    assert (plan.tokens, plan.positions, plan.logits) == ([9, 9], [3, 4], [False, True])
    assert plan.samples == [(b, 1)]
    d.run()
    d.check_cache()
    d.check_invariants()


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ([1, 2, 3, 4], 3),  # the same prompt: all but the last token
        ([1, 2, 3, 4, 1000, 1001], 5),  # the whole entry is a prefix: still the last one is decoded again
        ([1, 2], 1),  # shorter than the entry
        ([1, 2, 3, 4, 1000, 1001, 7, 8], 6),  # longer: the whole entry
    ],
)
def test_at_most_all_but_the_last_prompt_token_is_reused(prompt: list[int], expected: int) -> None:
    d = make(parallel=2, cache_slots=2)
    d.s.add("a", [1, 2, 3, 4], 3)
    d.run()
    b = d.s.add("b", prompt, 2)
    plan = d.step()
    assert b.cached_tokens == expected
    assert [op for op in plan.kv_ops if isinstance(op, KvCopy)][0].end == expected
    # the uncached rest of the prompt is computed, sampled at its last token; alone when everything before it was
    # cached
    assert plan.positions == list(range(expected, len(prompt)))
    assert plan.tokens == prompt[expected:]
    assert plan.logits == [False] * (len(prompt) - 1 - expected) + [True]
    assert plan.samples == [(b, len(prompt) - 1 - expected)]
    d.run()
    d.check_invariants()


def test_one_token_prompt_and_unrelated_prompt_reuse_nothing() -> None:
    d = make(parallel=2, cache_slots=2)
    d.s.add("a", [1, 2, 3], 2)
    d.run()
    b = d.s.add("b", [1], 2)
    c = d.s.add("c", [5, 2, 3], 2)
    plan = d.step()
    assert b.cached_tokens == 0 and c.cached_tokens == 0
    assert not any(isinstance(op, KvCopy) for op in plan.kv_ops)


def test_longest_matching_entry_is_chosen() -> None:
    d = make(parallel=1, cache_slots=4)
    short = d.s.add("short", [1, 2, 9], 1)
    d.run()
    long = d.s.add("long", [1, 2, 3, 4, 8], 1)
    d.run()
    assert set(d.s.cache) == {short.seq_id, long.seq_id}
    c = d.s.add("c", [1, 2, 3, 4, 5], 1)
    plan = d.step()
    assert plan.kv_ops == [KvCopy(long.seq_id, c.seq_id, 4)]


def test_lru_eviction_when_cache_slots_are_full() -> None:
    d = make(parallel=1, cache_slots=2)
    a = d.s.add("a", [1, 1], 1)
    d.run()
    b = d.s.add("b", [2, 2], 1)
    d.run()
    # a cache hit makes a the most recently used
    x = d.s.add("x", [1, 1, 7], 1)
    d.run()
    assert x.cached_tokens == 2
    # x's tokens cover a's: a was replaced by x (dedup), b is older
    assert list(d.s.cache) == [b.seq_id, x.seq_id]
    c = d.s.add("c", [3, 3], 1)
    d.run()
    assert list(d.s.cache) == [x.seq_id, c.seq_id]  # b, least recently used, was evicted
    d.flush_ops()
    assert KvRemove(b.seq_id) in d.kv.log
    d.check_cache()
    d.check_invariants()


def test_cache_hit_refreshes_lru_order() -> None:
    d = make(parallel=1, cache_slots=2)
    a = d.s.add("a", [1, 1, 1], 1)
    d.run()
    b = d.s.add("b", [2, 2, 2], 1)
    d.run()
    assert list(d.s.cache) == [a.seq_id, b.seq_id]
    hit = d.s.add("hit", [1, 1, 5], 1)  # uses a's prefix; its own entry [1,1,5] is not covered by a
    d.run()
    assert hit.cached_tokens == 2
    # a was touched by the hit, so b is now the oldest and was evicted for hit's entry
    assert list(d.s.cache) == [a.seq_id, hit.seq_id]
    d.flush_ops()
    d.check_cache()


def test_lru_eviction_when_kv_cells_are_needed() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    entries = []
    for i in range(3):
        q = d.s.add(f"e{i}", [10 + i] * 8, 1)  # 8 cells each as a cache entry
        d.run()
        entries.append(q)
    assert d.s.kv_cells_used == 24
    big = d.s.add("big", [99] * 24, 5)  # 24 cells and one for its first answer token: evict the two oldest
    plan = d.step()
    assert plan.admitted == [big]
    assert plan.kv_ops[:2] == [KvRemove(entries[0].seq_id), KvRemove(entries[1].seq_id)]
    assert list(d.s.cache) == [entries[2].seq_id]
    assert d.s.kv_cells_used == 8 + 24
    assert d.s.evictions["kv_cells"] == 2
    d.check_invariants()


def test_matching_entry_is_protected_while_others_are_evicted() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    match = d.s.add("m", [7] * 8, 1)
    d.run()
    other = d.s.add("o", [8] * 8, 1)
    d.run()
    q = d.s.add("q", [7] * 10 + [1] * 24, 5)  # 34 tokens, 8 of them in the oldest entry: 26 new + 1
    plan = d.step()
    assert plan.kv_ops == [KvRemove(other.seq_id), KvCopy(match.seq_id, q.seq_id, 8)]
    assert q.cached_tokens == 8
    d.check_invariants()


def test_matching_entry_is_evicted_when_nothing_else_makes_room() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    match = d.s.add("m", [7] * 10, 1)
    d.run()
    # the entry holds 10 cells; q computes 9 new (it reuses 9) plus 1 for its answer: 20 > 40 - 30 free... no —
    # a 39-token prompt sharing 9 needs 30 new cells + 1, and the entry's one unshared cell leaves 30 free
    q = d.s.add("q", [7] * 9 + [8] * 30, 1)
    plan = d.step()
    assert plan.admitted == [q]
    assert plan.kv_ops == [KvRemove(match.seq_id)]
    assert q.cached_tokens == 0
    assert plan.tokens == [7] * 9 + [8] * 30  # the whole prompt is computed again
    assert plan.samples == [(q, 38)]
    d.check_invariants()


def test_waiting_request_does_not_evict_the_cache_while_running_sequences_block_it() -> None:
    """Regression: a request waiting for running sequences used to evict every cache entry
    (including the one it would reuse) on every step, although that could never make room."""
    d = make(n_ctx=100, parallel=2, cache_slots=2)
    a = d.s.add("a", list(range(1, 11)), 2)
    d.run()
    entry = d.s.cache[a.seq_id]
    b = d.s.add("b", [99] * 80, 10)  # 80 cells, keeps running
    d.step(finish_at_max=False)
    d.step(finish_at_max=False)
    c = d.s.add("c", list(range(1, 11)) + [7] * 25, 15)  # 35 tokens, 25 new: must wait for b
    for _ in range(3):
        plan = d.step(finish_at_max=False)
        assert c.phase is Phase.WAITING
        assert plan.kv_ops == []
        assert d.s.cache == {a.seq_id: entry}
    d.finish(b, keep_in_cache=False)
    plan = d.step()
    assert plan.admitted == [c]
    assert KvCopy(a.seq_id, c.seq_id, 10) in plan.kv_ops
    assert c.cached_tokens == 10
    d.check_invariants()


def test_entry_covered_by_a_new_one_is_deduplicated() -> None:
    d = make(parallel=1, cache_slots=4)
    a = d.s.add("a", [1, 2, 3], 1)
    d.run()
    assert d.s.cache[a.seq_id].tokens == (1, 2, 3)
    b = d.s.add("b", [1, 2, 3, 4, 5], 1)
    d.run()
    # b's entry holds everything a's did: a is dropped
    assert list(d.s.cache) == [b.seq_id]
    assert d.s.cache[b.seq_id].tokens == (1, 2, 3, 4, 5)
    d.flush_ops()
    assert KvRemove(a.seq_id) in d.kv.log
    d.check_cache()
    d.check_invariants()


def test_new_entry_already_covered_by_an_existing_one_is_dropped() -> None:
    d = make(parallel=1, cache_slots=4)
    a = d.s.add("a", [1, 2, 3, 4, 5, 6], 1)
    d.run()
    b = d.s.add("b", [1, 2, 3], 1)  # reuses 2, its tokens [1,2,3] are a prefix of a's entry
    d.run()
    assert list(d.s.cache) == [a.seq_id]
    ops = d.flush_ops()
    assert ops == [KvRemove(b.seq_id)]
    d.check_cache()
    d.check_invariants()


def test_clear_cache_frees_every_entry() -> None:
    d = make(parallel=1, cache_slots=3)
    ids = []
    for i in range(3):
        q = d.s.add(str(i), [i + 1] * 4, 1)
        d.run()
        ids.append(q.seq_id)
    assert len(d.s.cache) == 3
    d.s.clear_cache()
    assert d.s.cache == {}
    assert sorted(op.seq_id for op in d.flush_ops()) == sorted(ids)
    assert d.kv.seqs == {} or all(not cells for cells in d.kv.seqs.values())
    assert sorted(d.s.kv.free_ids) == list(range(d.s.n_seq_max))
    assert d.s.kv_cells_used == 0
    assert d.s.evictions["cleared"] == 3


def test_cancelled_during_prefill_with_keep_in_cache_keeps_only_decoded_prompt() -> None:
    d = make(batch_size=4, parallel=1, cache_slots=2)
    a = d.s.add("a", list(range(1, 11)), 5)
    d.step()
    d.s.remove(a, keep_in_cache=True)
    assert d.s.cache[a.seq_id].tokens == (1, 2, 3, 4)
    d.check_cache()
    d.check_invariants()


def test_stats_properties() -> None:
    d = make(n_ctx=200, parallel=2, cache_slots=2)
    a = d.s.add("a", [1, 2, 3], 10)
    d.step(finish_at_max=False)
    assert d.s.kv_cells_used == 3
    assert kv_tokens(d.s) == 3  # the prompt
    d.step(finish_at_max=False)
    assert kv_tokens(d.s) == 4  # the first sampled token
    d.finish(a)
    assert d.s.kv_cells_used == 4 == kv_tokens(d.s)
    assert d.s.idle()


# ---- a KV stream per sequence (--deterministic) -------------------------------------------------------


def test_with_a_stream_per_sequence_each_sequence_is_bounded_and_copies_are_its_own_cells() -> None:
    s = Scheduler(n_ctx=6 * 32, batch_size=64, parallel=2, cache_slots=4, stream_cells=32)
    d = Driver(s)
    with pytest.raises(RequestTooLargeError, match="context of 32"):
        s.add("big", [1] * 30, 3)  # fits the 192 cells, not one stream
    first = s.add("first", list(range(1, 21)), 4)
    d.run()
    assert first in d.finished and len(s.cache) == 1
    again = s.add("again", list(range(1, 21)) + [99], 2)
    plan = d.step(finish_at_max=False)
    copies = [op for op in plan.kv_ops if isinstance(op, KvCopy)]
    assert copies and copies[-1].dst_seq == again.seq_id and again.cached_tokens == 20
    # the copy is the destination's own data: the ledger counts the entry's cells and the copy's
    assert s.kv_cells_used == sum(len(e.tokens) for e in s.cache.values()) + again.n_past
    d.check_invariants()


def test_with_a_stream_per_sequence_entries_move_up_and_running_sequences_keep_adjacent_ids() -> None:
    s = Scheduler(n_ctx=6 * 64, batch_size=64, parallel=3, cache_slots=3, stream_cells=64)
    d = Driver(s)
    a, b, c = (s.add(name, [n] * 10, 8) for n, name in ((1, "a"), (2, "b"), (3, "c")))
    d.step(finish_at_max=False)
    assert [q.seq_id for q in (a, b, c)] == [0, 1, 2]
    d.finish(b)  # its entry moves to the highest free id, a copy of its stream
    assert list(s.cache) == [5]
    assert KvCopy(1, 5, b.n_past) in d.flush_ops()
    new = s.add("new", [4] * 10, 8)
    d.step(finish_at_max=False)
    assert new.seq_id == 1  # beside a and c: one micro-batch
    assert d.kv.seqs[5] == list(s.cache[5].tokens) == b.kv_tokens
    d.check_invariants()
    d.check_coherent()
