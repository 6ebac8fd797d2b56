"""The batch scheduler (engine/scheduler.py), driven as the engine drives it."""

from __future__ import annotations

import pytest

from edge_llm.engine.scheduler import (
    KvCopy,
    KvRemove,
    Phase,
    RequestTooLargeError,
    Scheduler,
    common_prefix_length,
)

from .scheduler_model import Driver


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
    assert s.sequence_count() == 1


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
    d = make(n_ctx=100, parallel=4)
    a = d.s.add("a", [1] * 10, 50)  # 60 cells
    b = d.s.add("b", [2] * 10, 40)  # 50 cells: does not fit next to a
    c = d.s.add("c", [3] * 2, 3)  # 5 cells: would fit, but must not overtake b
    for _ in range(5):
        plan = d.step(finish_at_max=False)
        assert b.phase is Phase.WAITING and c.phase is Phase.WAITING
        assert d.s.running == [a]
        assert d.s.reserved_cells == 60
        d.check_invariants()
    assert list(d.s.waiting) == [b, c]
    d.finish(a, keep_in_cache=False)
    plan = d.step()
    assert plan.admitted == [b, c]
    assert d.s.reserved_cells == 55
    d.check_invariants()


def test_reserved_cells_never_exceed_context() -> None:
    d = make(n_ctx=64, batch_size=16, parallel=3)
    seqs = [d.s.add(f"r{i}", [i + 1] * (3 + i % 5), 4 + (i * 7) % 13) for i in range(12)]
    for _ in range(500):
        if d.s.idle():
            break
        d.step()
        d.check_invariants()
        assert d.s.reserved_cells <= 64
    assert d.s.idle()
    assert {q.request_id for q in d.finished} == {q.request_id for q in seqs}
    assert all(len(d.output[q.request_id]) == q.max_tokens for q in seqs)


# ---- prefill, decode and sampling points ------------------------------------------------------------


def test_long_prompt_is_prefilled_in_batch_size_chunks() -> None:
    d = make(batch_size=8, parallel=2)
    prompt = list(range(100, 120))  # 20 tokens
    a = d.s.add("a", prompt, 3)
    plans = [d.step(finish_at_max=False) for _ in range(3)]
    assert [len(p.tokens) for p in plans] == [8, 8, 4]
    assert [p.prefilled_tokens for p in plans] == [8, 8, 4]
    assert sum((p.tokens for p in plans), []) == prompt
    assert sum((p.positions for p in plans), []) == list(range(20))
    # logits only on the very last prompt token
    assert [p.logits for p in plans[:2]] == [[False] * 8, [False] * 8]
    assert plans[2].logits == [False, False, False, True]
    assert plans[0].samples == [] and plans[1].samples == []
    assert plans[2].samples == [(a, 3)]
    assert a.phase is Phase.DECODE and a.n_past == 20


def test_decode_token_follows_the_prompt_at_the_next_position() -> None:
    d = make(batch_size=16)
    a = d.s.add("a", [5, 6, 7], 3)
    d.step()
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
    s.add("a", [1, 2], 5)
    plan = s.step()
    assert len(plan.tokens) == 2
    assert s.step().empty  # nothing sampled yet: nothing to decode


def test_decode_tokens_come_first_and_are_never_starved_by_a_prefill() -> None:
    d = make(batch_size=8, parallel=3)
    a = d.s.add("a", [1, 2], 30)
    d.step(finish_at_max=False)  # a prefilled and sampled
    b = d.s.add("b", list(range(200, 240)), 2)  # 40-token prompt
    c = d.s.add("c", list(range(300, 310)), 2)
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
    # b was prefilled in chunks of batch_size - 1 (one slot taken by a's decode token)
    assert b_chunks[:5] == [list(range(200 + 7 * i, 207 + 7 * i)) for i in range(5)]
    # c waited for b's prefill to finish (FIFO among prefills), then shared a step with it
    assert a.generated == step + 2


def test_several_sequences_prefill_in_one_step_with_one_sample_each() -> None:
    d = make(batch_size=32, parallel=3)
    seqs = [d.s.add(str(i), [10 * i + k for k in range(1, 4 + i)], 2) for i in range(3)]
    plan = d.step(finish_at_max=False)
    assert plan.admitted == seqs
    assert len(plan.tokens) == 3 + 4 + 5
    assert [index for _, index in plan.samples] == [2, 6, 11]
    assert [q for q, _ in plan.samples] == seqs
    assert [plan.tokens[i] for _, i in plan.samples] == [q.prompt[-1] for q in seqs]
    assert sum(plan.logits) == 3
    # the next step decodes all three together
    plan = d.step(finish_at_max=False)
    assert plan.seq_ids == [q.seq_id for q in seqs]
    assert plan.positions == [3, 4, 5]


# ---- cancellation -------------------------------------------------------------------------------


def test_cancel_while_waiting() -> None:
    d = make(parallel=1)
    a = d.s.add("a", [1, 2], 5)
    b = d.s.add("b", [3, 4], 5)
    d.step(finish_at_max=False)
    d.s.remove(b)
    assert list(d.s.waiting) == []
    assert d.s.take_pending_ops() == []  # it never had a seq id
    d.finish(a, keep_in_cache=False)
    plan = d.step()
    assert plan.admitted == []
    assert d.s.idle()
    d.check_invariants()


def test_cancel_during_prefill_frees_the_seq_id() -> None:
    d = make(batch_size=4, parallel=1)
    a = d.s.add("a", list(range(1, 11)), 5)
    d.step()
    assert a.phase is Phase.PREFILL and a.n_past == 4
    seq_id = a.seq_id
    d.s.remove(a)
    assert d.s.running == []
    assert d.flush_ops() == [KvRemove(seq_id)]
    assert seq_id in d.s._free_seq_ids
    d.check_invariants()
    # the slot is reusable at once
    b = d.s.add("b", [7, 8], 2)
    d.step()
    assert b.phase is Phase.DECODE


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
    assert d.s.reserved_cells == 6


def test_shared_prefix_is_copied_from_the_cache() -> None:
    d = make(parallel=2, cache_slots=2)
    a = d.s.add("a", [1, 2, 3, 4], 3)
    d.run()
    b = d.s.add("b", [1, 2, 3, 9, 9], 2)
    plan = d.step()
    assert plan.admitted == [b]
    assert plan.kv_ops == [KvCopy(a.seq_id, b.seq_id, 3)]
    assert b.cached_tokens == 3
    # only the rest of the prompt is decoded, from position 3 on
    assert plan.tokens == [9, 9]
    assert plan.positions == [3, 4]
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
    assert [op for op in plan.kv_ops if isinstance(op, KvCopy)][0].length == expected
    assert plan.positions[0] == expected
    assert plan.tokens == prompt[expected:]
    assert plan.logits[-1] and sum(plan.logits) == 1
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


def test_lru_eviction_when_kv_budget_is_needed() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    entries = []
    for i in range(3):
        q = d.s.add(f"e{i}", [10 + i] * 8, 1)  # 8 cells each as a cache entry
        d.run()
        entries.append(q)
    assert d.s.reserved_cells == 24
    big = d.s.add("big", [99] * 20, 5)  # 25 cells: needs 24 + 25 - 40 = 9 → evict the two oldest
    plan = d.step()
    assert plan.admitted == [big]
    assert plan.kv_ops[:2] == [KvRemove(entries[0].seq_id), KvRemove(entries[1].seq_id)]
    assert list(d.s.cache) == [entries[2].seq_id]
    assert d.s.reserved_cells == 33
    d.check_invariants()


def test_matching_entry_is_protected_while_others_are_evicted() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    match = d.s.add("m", [7] * 8, 1)
    d.run()
    other = d.s.add("o", [8] * 8, 1)
    d.run()
    q = d.s.add("q", [7] * 10, 20)  # 30 cells; shares 8 with the oldest entry
    plan = d.step()
    assert plan.kv_ops == [KvRemove(other.seq_id), KvCopy(match.seq_id, q.seq_id, 8)]
    assert q.cached_tokens == 8
    d.check_invariants()


def test_matching_entry_is_evicted_when_nothing_else_makes_room() -> None:
    d = make(n_ctx=40, parallel=1, cache_slots=4)
    match = d.s.add("m", [7] * 10, 1)
    d.run()
    q = d.s.add("q", [7] * 10, 30)  # 40 cells: the whole context; the entry must go
    plan = d.step()
    assert plan.admitted == [q]
    assert plan.kv_ops == [KvRemove(match.seq_id)]
    assert q.cached_tokens == 0
    assert plan.tokens == [7] * 10
    d.check_invariants()


def test_waiting_request_does_not_evict_the_cache_while_running_sequences_block_it() -> None:
    """Regression: a request waiting for running sequences used to evict every cache entry
    (including the one it would reuse) on every step, although that could never make room."""
    d = make(n_ctx=100, parallel=2, cache_slots=2)
    a = d.s.add("a", list(range(1, 11)), 2)
    d.run()
    entry = d.s.cache[a.seq_id]
    b = d.s.add("b", [99] * 20, 60)  # 80 cells, keeps running
    d.step(finish_at_max=False)
    c = d.s.add("c", list(range(1, 11)) + [7] * 5, 15)  # 30 cells: must wait for b
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
    assert sorted(d.s._free_seq_ids) == list(range(d.s.n_seq_max))
    assert d.s.reserved_cells == 0


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
    assert d.s.reserved_cells == 13
    assert d.s.active_kv_tokens == 3
    d.step(finish_at_max=False)
    assert d.s.active_kv_tokens == 4
    d.finish(a)
    assert d.s.reserved_cells == 4 == d.s.active_kv_tokens
    assert d.s.idle()
