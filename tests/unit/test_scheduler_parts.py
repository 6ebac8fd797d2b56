"""The scheduler's parts at their boundaries (engine/scheduling/: kv_book, sharing, admission's reserve_entry and
reusable_length, chunk_moves, step_plan, and the scheduler's add, remove, undo_step and room for a step): the cases
the driven scenarios of test_scheduler.py seldom reach, each at its exact limit and one past it. Pure, no model."""

from __future__ import annotations

import pytest

from edge_llm.engine.scheduling.chunk_moves import ChunkMove
from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence
from edge_llm.engine.scheduling.step_plan import KvCopy, KvRemove, KvShift, KvTrim, StepPlan

from .scheduler_model import Driver


def scheduler(n_ctx: int = 100, parallel: int = 2, cache_slots: int = 2, **kwargs) -> Scheduler:
    return Scheduler(n_ctx=n_ctx, batch_size=16, parallel=parallel, cache_slots=cache_slots, **kwargs)


# ---- kv_book ------------------------------------------------------------------------------------


def test_a_prefix_copied_into_its_own_stream_is_charged_to_the_destination_and_freed_with_it() -> None:
    book = KvBook(n_ctx=100, n_seq_max=3, stream_cells=30)
    book.ledger.grow(0, 10)
    dst = Sequence("d", list(range(12)), 4, seq_id=book.take_id() + 1, feed=list(range(12)))
    book.share_prefix(0, dst, 8)
    assert book.used == 18 and book.ledger.length(dst.seq_id) == 8
    assert (dst.n_past, dst.kv_tokens, dst.cached_tokens) == (8, list(range(8)), 8)
    book.release(dst.seq_id)
    assert book.used == 10
    assert book.take_all_ops() == [KvCopy(0, dst.seq_id, 8), KvRemove(dst.seq_id)]


def test_a_shared_prefix_counts_as_cached_only_at_the_first_admission_and_only_the_prompt() -> None:
    book = KvBook(n_ctx=100, n_seq_max=3, stream_cells=None)
    book.ledger.grow(0, 20)
    resumed = Sequence("r", [1] * 6, 10, seq_id=1, feed=[1] * 12, preemptions=1)
    book.share_prefix(0, resumed, 10)
    assert resumed.cached_tokens == 0 and resumed.n_past == 10
    fresh = Sequence("f", [1] * 6, 10, seq_id=2, feed=[1] * 12)
    book.share_prefix(0, fresh, 10)
    assert fresh.cached_tokens == 6  # the prompt's positions only, not the output's
    assert book.used == 20  # shared cells, counted once


def test_ids_are_taken_lowest_first_and_a_released_id_goes_back_in_order() -> None:
    book = KvBook(n_ctx=10, n_seq_max=4, stream_cells=None)
    assert [book.take_id() for _ in range(3)] == [0, 1, 2]
    book.release(1)
    book.release(0, queue_removal=False)
    book.release(-1)  # never admitted: nothing to release
    assert book.free_ids == [0, 1, 3]
    assert book.take_all_ops() == [KvRemove(1)]
    assert book.sequence_context == 10 and book.free_cells == 10


def test_ops_held_for_after_the_decode_go_first_in_the_next_step_but_not_between() -> None:
    book = KvBook(n_ctx=10, n_seq_max=4, stream_cells=6)
    assert book.sequence_context == 6
    book.after_decode.append(KvRemove(3))
    book.pending.append(KvRemove(2))
    assert book.take_pending_ops() == [KvRemove(2)]
    book.pending.append(KvRemove(1))
    assert book.take_all_ops() == [KvRemove(3), KvRemove(1)]
    assert book.take_all_ops() == [] and book.after_decode == []


# ---- sharing ------------------------------------------------------------------------------------


def test_a_leader_leaving_exactly_when_it_has_computed_the_shared_prefix_hands_it_over() -> None:
    s = Scheduler(n_ctx=200, batch_size=12, parallel=2, cache_slots=0)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 21)), 4)
    follower = s.add("follower", list(range(1, 13)) + [99] * 8, 4)
    d.step(finish_at_max=False)
    assert follower.leader is leader and follower.shared == 12 and leader.n_past == 12
    d.finish(leader, keep_in_cache=False)
    assert follower.leader is None and follower.n_past == 12
    assert d.flush_ops() == [KvCopy(leader.seq_id, follower.seq_id, 12), KvRemove(leader.seq_id)]
    plan = d.step(finish_at_max=False)
    assert plan.positions[0] == 12 and plan.prefilled_tokens == 8
    d.check_invariants()


def test_a_follower_takes_the_shared_prefix_in_the_step_after_the_leader_computed_exactly_that() -> None:
    s = Scheduler(n_ctx=200, batch_size=12, parallel=2, cache_slots=0)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 21)), 4)
    follower = s.add("follower", list(range(1, 13)) + [99] * 8, 4)
    d.step(finish_at_max=False)
    assert leader.n_past == 12 and follower.leader is leader
    plan = d.step(finish_at_max=False)
    assert KvCopy(leader.seq_id, follower.seq_id, 12) in plan.kv_ops
    assert [p for p, q in zip(plan.positions, plan.seq_ids) if q == follower.seq_id] == [12, 13, 14, 15]
    d.check_invariants()


def test_a_leader_leaving_before_the_shared_prefix_leaves_its_follower_to_prefill_alone() -> None:
    s = Scheduler(n_ctx=200, batch_size=11, parallel=2, cache_slots=0)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 21)), 4)
    follower = s.add("follower", list(range(1, 13)) + [99] * 8, 4)
    d.step(finish_at_max=False)
    assert follower.leader is leader and leader.n_past == 11
    d.finish(leader, keep_in_cache=False)
    assert follower.leader is None and follower.n_past == 0
    plan = d.step(finish_at_max=False)
    assert plan.positions[:1] == [0]
    d.check_invariants()


def test_with_a_stream_per_sequence_a_prefix_taken_from_a_leader_counts_before_the_next_admission() -> None:
    # The leader holds 20 cells; a follower copying all 20 into its own stream holds 20 more at once: a third
    # prompt of 24 (with its next token and the running sequences' next ones, 28 cells) no longer fits in 64.
    s = Scheduler(n_ctx=64, batch_size=64, parallel=3, cache_slots=0, stream_cells=32)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 21)), 8)
    d.step(finish_at_max=False)
    assert leader.n_past == 20
    follower = s.add("follower", leader.kv_tokens + [99], 4)
    third = s.add("third", [7] * 24, 4)
    plan = d.step(finish_at_max=False)
    assert follower in plan.admitted and third not in plan.admitted
    assert s.kv_cells_used == 20 + 1 + 20 + 1  # the leader's next token; the follower's copy and its last token
    d.check_invariants()


def test_the_leader_is_the_running_sequence_sharing_the_longest_prefix_of_at_least_eight() -> None:
    s = scheduler(n_ctx=400, parallel=4, cache_slots=0)
    d = Driver(s)
    short = s.add("short", list(range(1, 9)) + [50] * 10, 4)
    long = s.add("long", list(range(1, 11)) + [60] * 10, 4)
    d.step(finish_at_max=False)
    head = s.add("head", list(range(1, 11)) + [70] * 5, 4)
    assert s.sharing.best_leader(head) == (long, 10)
    seven = s.add("seven", list(range(1, 8)) + [80] * 5, 4)
    assert s.sharing.best_leader(seven) is None
    eight = s.add("eight", list(range(1, 9)) + [80] * 5, 4)
    assert s.sharing.best_leader(eight) == (short, 8)  # a tie: the oldest, the last a preemption would take
    whole = s.add("whole", list(range(1, 11)), 4)
    assert s.sharing.best_leader(whole) == (long, 9)  # its last token is decoded again: its logits
    assert short.phase is not Phase.WAITING


# ---- admission: reserve_entry, reusable_length ----------------------------------------------------------------


def test_reserve_entry_needs_a_cache_and_an_entry_that_fits_one_sequence() -> None:
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    assert scheduler(cache_slots=0).reserve_entry(head, 10, 6) is None
    assert scheduler().reserve_entry(head, 0, 0) is None
    assert scheduler().reserve_entry(head, -1, 0) is None
    streams = scheduler(n_ctx=400, stream_cells=40)
    assert streams.reserve_entry(head, 41, 6) is None
    assert streams.reserve_entry(head, 40, 6) == 0


def test_reserve_entry_keeps_room_for_the_head_exactly() -> None:
    # The head computes 10 - 6 of its feed and one token: 5 cells; the entry's 95 fill the context exactly.
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    assert scheduler().reserve_entry(head, 96, 6) is None
    s = scheduler()
    assert s.reserve_entry(head, 95, 6) == 0
    assert s.reserve_entry(head, 95, 6) == 1  # reserved ids are not free (the cells come with adopt_entry)
    assert s.reserve_entry(head, 1, 6) == 2
    assert s.reserve_entry(head, 1, 6) == 3
    assert s.reserve_entry(head, 1, 6) is None  # no id left


def test_reserve_entry_counts_running_sequences_their_prompts_to_come_and_a_preempted_heads_margin() -> None:
    s = scheduler(max_preemptions=2)
    d = Driver(s)
    running = s.add("a", [7] * 40, 10)
    d.step(finish_at_max=False)  # 16 of its 40 prompt tokens computed, 24 to come
    assert running.n_past == 16 and running.phase is Phase.PREFILL
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    # 16 used, 24 to come, 1 decode token per running sequence, 5 for the head: 54 cells left for the entry.
    assert s.reserve_entry(head, 55, 6) is None
    assert s.reserve_entry(head, 54, 6) == 1
    s.release_entry(1)
    head.preemptions = 1  # a preempted head keeps RESUME_STEPS (16) decode tokens per running sequence
    assert s.reserve_entry(head, 40, 6) is None
    assert s.reserve_entry(head, 39, 6) == 1
    s.release_entry(1)
    head.preemptions = 2  # pinned: room for its whole answer, 15 - 6
    assert s.reserve_entry(head, 36, 6) is None
    assert s.reserve_entry(head, 35, 6) == 1


def test_reserve_entry_evicts_the_oldest_entries_only_when_that_makes_room() -> None:
    s = scheduler(n_ctx=100, parallel=1, cache_slots=2)
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    for tokens in ((1,) * 30, (2,) * 30):
        seq_id = s.reserve_entry(head, len(tokens), 0)
        assert seq_id is not None
        s.adopt_entry(seq_id, tokens)
    assert list(s.cache) == [0, 1] and s.kv_cells_used == 60
    # both slots taken: the oldest goes, the newer one stays as 30 + 59 + 11 = 100 fit
    assert s.reserve_entry(head, 59, 0) == 0
    assert list(s.cache) == [1] and s.evictions["cache_slots"] == 1 and sum(s.evictions.values()) == 1
    s.release_entry(0)
    # 30 + 60 + 11 > 100: the last entry goes too, for cells this time (a slot and an id are free)
    assert s.reserve_entry(head, 60, 0) == 0
    assert list(s.cache) == [] and s.evictions["kv_cells"] == 1 and sum(s.evictions.values()) == 2


def test_reserve_entry_makes_the_entry_a_slot_before_it_is_loaded() -> None:
    s = scheduler(n_ctx=1000, parallel=1, cache_slots=2)
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    for tokens in ((1,) * 10, (2,) * 10):
        seq_id = s.reserve_entry(head, len(tokens), 0)
        assert seq_id is not None
        s.adopt_entry(seq_id, tokens)
    assert s.kv.free_ids == [2]
    # room for every cell and a free id, but both slots are taken: the least recently used entry goes now
    assert s.reserve_entry(head, 10, 0) == 0
    assert list(s.cache) == [1] and s.evictions["cache_slots"] == 1 and s.evictions["kv_cells"] == 0


def test_reserve_entry_evicts_nothing_when_running_sequences_alone_leave_no_room() -> None:
    s = scheduler(n_ctx=100, parallel=1, cache_slots=2)
    d = Driver(s)
    entry = s.reserve_entry(Sequence("h", [1], 1, feed=[1]), 10, 0)
    assert entry is not None
    s.adopt_entry(entry, (3,) * 10)
    running = s.add("a", [7] * 60, 10)
    d.step(finish_at_max=False)
    assert running.n_past == 16
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    # 16 + 44 to come + 1 + 11 = 72: an entry of 28 fits once the cached one is gone, 29 never does
    assert s.reserve_entry(head, 29, 0) is None
    assert list(s.cache) == [entry]
    assert s.reserve_entry(head, 28, 0) is not None
    assert list(s.cache) == [] and s.evictions["kv_cells"] == 1  # (an id was free: cells were missing)


def test_reserve_entry_frees_an_id_held_by_an_entry_when_none_is_free() -> None:
    s = scheduler(n_ctx=1000, parallel=1, cache_slots=1)
    d = Driver(s)
    d.s.add("a", [5] * 10, 3)
    d.run()
    assert list(s.cache) == [0]
    running = s.add("b", [6] * 10, 30)
    d.step(finish_at_max=False)
    assert running.seq_id == 1 and not s.kv.free_ids
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    assert s.reserve_entry(head, 10, 0) == 0
    assert list(s.cache) == [] and s.evictions["cache_slots"] == 1


def test_reusable_length_is_the_longer_of_the_cached_prefix_and_the_leaders() -> None:
    s = scheduler(n_ctx=400, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("cached", list(range(1, 13)) + [40] * 4, 2)
    d.run()
    assert s.reusable_length(Sequence("x", [9] * 5, 2, feed=[9] * 5)) == 0
    head = Sequence("h", list(range(1, 13)) + [41] * 4, 2, feed=list(range(1, 13)) + [41] * 4)
    assert s.reusable_length(head) == 12
    s.add("leader", list(range(1, 16)) + [42] * 4, 4)
    d.step(finish_at_max=False)
    longer = Sequence("l", list(range(1, 16)) + [43] * 4, 2, feed=list(range(1, 16)) + [43] * 4)
    assert s.reusable_length(longer) == 15
    assert s.reusable_length(head) == 12
    alone = Sequence("a", list(range(1, 16)) + [43] * 4, 2, feed=list(range(1, 16)) + [43] * 4, use_cache=False)
    assert s.reusable_length(alone) == 0


# ---- step_plan ------------------------------------------------------------------------------------


def test_a_step_plan_lays_out_rows_in_order_and_is_empty_without_tokens() -> None:
    plan = StepPlan()
    assert plan.empty
    assert plan.add(5, 0, 2, False) == 0
    assert plan.add(6, 1, 2, True) == 1
    assert not plan.empty
    assert (plan.tokens, plan.positions, plan.seq_ids, plan.logits) == ([5, 6], [0, 1], [2, 2], [False, True])
    assert plan.undoable and plan.prefilled_tokens == 0
    assert KvCopy(1, 2, 3) == KvCopy(1, 2, end=3, start=0)


# ---- chunk_moves ----------------------------------------------------------------------------------

FILE_HEAD, FILE_TAIL = list(range(100, 140)), list(range(200, 260))


def test_a_chunk_found_again_at_its_own_positions_is_reused_without_a_shift_and_counts_as_not_moved() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    first = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 3, reuse_min=16)
    d.run()
    edited = FILE_HEAD + [7, 50] + FILE_TAIL + [9]  # one token replaced: the rest stays where it was
    after = s.add("after", edited, 3, reuse_min=16)
    d.step(finish_at_max=False)
    assert after.seq_id == first.seq_id
    assert after.cached_tokens == 41 + 60 and after.moved_tokens == 0
    ops = d.plans[-1].kv_ops + s.kv.after_decode
    assert not any(isinstance(op, KvShift) for op in ops)
    assert KvCopy(ops[0].dst_seq, first.seq_id, start=42, end=102) in ops
    d.check_invariants()
    d.run()
    assert d.output["after"] == [1000, 1001, 1002]


def test_a_sequence_leaving_before_its_prefill_reaches_its_moved_chunk_frees_the_chunks_holder() -> None:
    s = Scheduler(n_ctx=400, batch_size=2, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1, reuse_min=16)
    d.run()
    after = s.add("after", FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9], 3, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert after.moved is not None and after.n_past == 44  # two of the three typed tokens: the chunk still waits
    holder = after.moved.holder
    assert plan.kv_ops[0] == KvCopy(after.seq_id, holder, start=42, end=102)
    d.finish(after, keep_in_cache=False)
    assert after.moved is None
    assert KvRemove(holder) in d.flush_ops()
    assert s.kv_cells_used == 0 and holder in s.kv.free_ids
    d.check_invariants()


def test_a_deleted_span_moves_the_rest_into_place_before_the_first_decode() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    first = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1, reuse_min=16)
    d.run()
    after = s.add("after", FILE_HEAD + FILE_TAIL + [9], 3, reuse_min=16)  # the two tokens deleted
    plan = d.step(finish_at_max=False)
    holder = plan.kv_ops[0].dst_seq
    assert plan.kv_ops == [KvCopy(first.seq_id, holder, start=42, end=102), KvTrim(first.seq_id, 40),
                           KvShift(holder, 42, 102, -2), KvCopy(holder, first.seq_id, start=40, end=100),
                           KvRemove(holder)]
    assert after.moved is None and after.cached_tokens == 100 and after.moved_tokens == 60
    assert plan.undoable and plan.prefilled_tokens == 0  # the last prompt token is decoded: nothing to prefill
    d.check_invariants()
    d.run()
    assert d.output["after"] == [1000, 1001, 1002]
    s.clear_cache()
    assert s.kv_cells_used == 0  # the moved cells were charged to the sequence, and went with its entry


# ---- admission ----------------------------------------------------------------------------------


def test_no_more_sequences_run_than_parallel_even_with_ids_to_spare() -> None:
    s = Scheduler(n_ctx=400, batch_size=16, parallel=1, cache_slots=2)
    d = Driver(s)
    a, b = s.add("a", [1] * 5, 3), s.add("b", [2] * 5, 3)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [a] and list(s.waiting) == [b] and len(s.kv.free_ids) == 2


def test_a_request_that_does_not_use_the_cache_takes_no_prefix_from_it() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("a", list(range(1, 21)), 2)
    d.run()
    assert len(s.cache) == 1
    b = s.add("b", list(range(1, 21)) + [5], 2, use_cache=False)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [b] and b.cached_tokens == 0 and plan.prefilled_tokens == 21
    assert not any(isinstance(op, KvCopy) for op in plan.kv_ops)
    d.check_invariants()


def test_a_head_following_a_leader_counts_the_cached_entry_whole_even_when_a_chunk_of_it_could_move() -> None:
    # The entry could give the head its first 42 tokens and a moved chunk of 60, but the running leader shares 43:
    # the head follows the leader and the entry stays whole, so its cells are not room for the head (counting them
    # as freed by a move that is not made would admit the head with too few free cells to prefill).
    s = Scheduler(n_ctx=200, batch_size=128, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    leader = s.add("leader", FILE_HEAD + [7, 8, 50] + FILE_TAIL + [9], 50)
    d.step(finish_at_max=False)
    assert s.kv_cells_used == 103 + 62
    head = s.add("head", FILE_HEAD + [7, 8, 50, 51] + FILE_TAIL + [9], 3, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [head] and head.leader is None and head.cached_tokens == 43
    assert not s.cache and plan.prefilled_tokens == 105 - 43  # the entry made room; the whole rest computed
    assert leader.phase is Phase.DECODE
    d.check_invariants()


def test_when_keeping_the_matched_entry_leaves_no_room_the_head_takes_what_the_entries_left_give() -> None:
    prefix = list(range(1, 11))
    s = Scheduler(n_ctx=72, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    small = s.add("small", prefix + [88] * 5, 1)
    d.run()
    big = s.add("big", prefix + [77] * 55, 1)  # its first 10 cells shared with the small entry
    d.run()
    touch = s.add("touch", prefix + [99], 1)  # takes the small entry's prefix: the big entry is now the oldest
    d.step(finish_at_max=False)
    d.finish(touch, keep_in_cache=False)
    assert list(s.cache) == [big.seq_id, small.seq_id] and s.kv_cells_used == 70
    # 35 from the big entry would leave 8 cells to compute in 72 - 65; without it the head computes 43, which fit
    # beside the small entry alone: the big one goes, and the head still takes the small one's 10
    head = s.add("head", prefix + [77] * 25 + [5] * 7, 1)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [head] and list(s.cache) == [small.seq_id]
    assert head.cached_tokens == 10 and KvCopy(small.seq_id, head.seq_id, 10) in plan.kv_ops
    d.check_invariants()


def test_a_cached_prefix_as_long_as_a_leaders_is_taken_from_the_cache() -> None:
    prefix = list(range(1, 21))
    s = Scheduler(n_ctx=400, batch_size=64, parallel=3, cache_slots=2)
    d = Driver(s)
    entry = s.add("entry", prefix + [1], 1)
    d.run()
    leader = s.add("leader", prefix + [2] * 30, 10)
    d.step(finish_at_max=False)
    head = s.add("head", prefix + [3] * 5, 2)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [head] and head.leader is None
    assert KvCopy(entry.seq_id, head.seq_id, 20) in plan.kv_ops and leader.phase is Phase.DECODE
    d.check_invariants()


def test_a_head_that_fits_only_with_the_prefix_its_leader_shares_is_admitted() -> None:
    s = Scheduler(n_ctx=60, batch_size=64, parallel=2, cache_slots=0)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 41)), 10)
    d.step(finish_at_max=False)
    head = s.add("head", list(range(1, 41)) + [5] * 5, 2)  # 40 + 1 held, 6 to compute and 1 for the leader
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [head] and head.cached_tokens == 40 and leader.phase is Phase.DECODE
    d.check_invariants()


def test_a_take_over_counts_its_moved_chunk_and_evicts_other_entries_for_it() -> None:
    s = Scheduler(n_ctx=155, batch_size=128, parallel=2, cache_slots=2)
    d = Driver(s)
    entry = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    other = s.add("other", [3] * 50, 1)
    d.run()
    assert s.kv_cells_used == 103 + 50
    # the take-over counts the entry's first 42 cells, its chunk of 60 held apart, and 5 cells the head computes:
    # 107, and the other entry's 50 are 2 over the 155: it goes
    head = s.add("head", FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9], 2, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [head] and head.seq_id == entry.seq_id and head.cached_tokens == 102
    assert other.seq_id not in s.cache and s.evictions["kv_cells"] == 1
    d.check_invariants()
    d.run()


def test_when_a_moved_chunks_holder_took_the_last_free_id_an_admission_evicts_an_entry_for_one() -> None:
    s = Scheduler(n_ctx=1000, batch_size=4, parallel=2, cache_slots=2)  # 4 sequence ids
    d = Driver(s)
    entry = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    other = s.add("other", [3] * 10, 1)
    d.run()
    short = s.add("short", [4] * 3, 2)
    edit = s.add("edit", FILE_HEAD + [7, 8] + list(range(50, 90)) + FILE_TAIL + [9], 2, reuse_min=16)
    d.step()
    assert edit.seq_id == entry.seq_id and edit.moved is not None  # its chunk's holder took the last free id
    d.step()  # short finishes: its entry joins the other one in the cache
    assert short in d.finished and list(s.cache) == [other.seq_id, short.seq_id] and not s.kv.free_ids
    assert edit.moved is not None
    late = s.add("late", [9] * 5, 2)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [late] and late.seq_id == other.seq_id and list(s.cache) == [short.seq_id]
    assert s.evictions["cache_slots"] == 1
    d.check_invariants()
    d.run()


def test_when_the_only_id_to_free_is_the_matched_entrys_the_head_evicts_it_and_computes_all() -> None:
    s = Scheduler(n_ctx=1000, batch_size=4, parallel=2, cache_slots=1)  # 3 sequence ids
    d = Driver(s)
    entry = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    short = s.add("short", [4] * 3, 2)
    edit = s.add("edit", FILE_HEAD + [7, 8] + list(range(50, 90)) + FILE_TAIL + [9], 2, reuse_min=16)
    d.step()
    d.step()
    assert edit.seq_id == entry.seq_id and edit.moved is not None
    assert list(s.cache) == [short.seq_id] and not s.kv.free_ids
    late = s.add("late", [4] * 3 + [9] * 3, 2)  # its first 3 tokens are the entry's
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [late] and late.seq_id == short.seq_id and late.cached_tokens == 0 and not s.cache
    d.check_invariants()
    d.run()


def test_a_chunk_moves_for_a_reuse_minimum_of_one_and_never_for_a_preempted_sequence() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    edited = FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9]
    head = Sequence("h", edited, 2, feed=edited, reuse_min=1)
    match = s.cached.best_prefix(head.feed)
    assert s.moves.movable(head, match, None) == ChunkMove(42, 45, 60, frozenset())
    head.preemptions = 1
    assert s.moves.movable(head, match, None) is None
    after = s.add("after", edited, 2, reuse_min=1)
    d.step(finish_at_max=False)
    assert after.moved_tokens == 60


def test_a_leader_sharing_no_more_than_the_entry_does_not_stop_its_chunk_from_moving() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=3, cache_slots=2)
    d = Driver(s)
    entry = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    leader = s.add("leader", FILE_HEAD + [7, 8] + [30] * 5, 20)  # shares the entry's first 42 cells
    d.step(finish_at_max=False)
    head = s.add("head", FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9], 2, reuse_min=16)
    d.step(finish_at_max=False)
    assert head.leader is None and head.seq_id == entry.seq_id and head.moved_tokens == 60
    assert leader.phase is Phase.DECODE
    d.check_invariants()


def test_a_chunk_whose_first_cells_a_running_sequence_shares_does_not_move() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=3, cache_slots=2)
    d = Driver(s)
    entry = s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    runner = s.add("runner", FILE_HEAD + [7, 8] + FILE_TAIL[:2] + [30] * 3, 20)  # holds the chunk's first 2 cells
    d.step(finish_at_max=False)
    assert runner.cached_tokens == 44
    head = s.add("head", FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9], 2, reuse_min=16)  # the chunk: at 42
    plan = d.step(finish_at_max=False)
    assert head.seq_id != entry.seq_id and head.cached_tokens == 42 and head.moved_tokens == 0
    assert not any(isinstance(op, KvShift) for op in plan.kv_ops + s.kv.after_decode)
    d.check_invariants()


def test_reserve_entry_counts_a_prefilling_sequences_rest_but_its_moved_chunk_and_nothing_for_a_decoding_one() -> None:
    s = Scheduler(n_ctx=1000, batch_size=4, parallel=3, cache_slots=2)
    d = Driver(s)
    s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    decoding = s.add("decoding", [6] * 3, 30)
    edit = s.add("edit", FILE_HEAD + [7, 8] + list(range(50, 90)) + FILE_TAIL + [9], 2, reuse_min=16)
    for _ in range(3):
        d.step(finish_at_max=False)
    assert (decoding.phase, decoding.n_past) == (Phase.DECODE, 5)
    assert (edit.phase, edit.n_past, len(edit.feed), edit.moved.length) == (Phase.PREFILL, 49, 143, 60)
    assert s.kv_cells_used == 49 + 60 + 5
    head = Sequence("h", list(range(10)), 5, feed=list(range(10)))
    # 114 used; the edit's 143 - 49 - 60 = 34 still to compute; 1 decode token for each of the 2; the head's 11
    assert s.reserve_entry(head, 1000 - 114 - 34 - 2 - 11 + 1, 0) is None
    assert s.reserve_entry(head, 1000 - 114 - 34 - 2 - 11, 0) == 3


# ---- scheduler: a step taken back (undo_step) ------------------------------------------------------


def test_a_step_taken_back_leaves_each_sequence_as_the_step_found_it_and_skips_those_without_rows() -> None:
    s = Scheduler(n_ctx=400, batch_size=12, parallel=3, cache_slots=0)
    d = Driver(s)
    leader = s.add("leader", list(range(1, 21)), 3)
    follower = s.add("follower", list(range(1, 17)) + [99] * 4, 3)  # waits for the leader's first 16
    d.step()
    third = s.add("third", [5] * 6, 3)
    assert leader.n_past == 12 and follower.leader is leader
    used = s.kv_cells_used
    plan = s.step()
    assert [q for q in plan.seq_ids if q == follower.seq_id] == [] and third.seq_id in plan.seq_ids
    assert leader.phase is Phase.DECODE and leader.n_past == 20
    d.kv.apply_ops(plan.kv_ops)  # applied, then the decode stopped before it did anything
    s.undo_step(plan)
    assert (leader.n_past, leader.phase, leader.pending_token, leader.kv_tokens) == (12, Phase.PREFILL, None,
                                                                                    list(range(1, 13)))
    assert (third.n_past, third.phase, third.kv_tokens) == (0, Phase.PREFILL, [])
    assert follower.n_past == 0 and follower.leader is leader
    assert s.kv_cells_used == used
    assert s.take_pending_ops() == [KvTrim(leader.seq_id, 12), KvTrim(third.seq_id, 0)]
    d.run()
    assert d.output == {"leader": [1000, 1001, 1002], "follower": [1000, 1001, 1002], "third": [1000, 1001, 1002]}


def test_a_decode_step_taken_back_decodes_the_same_token_again() -> None:
    s = Scheduler(n_ctx=400, batch_size=16, parallel=2, cache_slots=0)
    d = Driver(s)
    a = s.add("a", [1, 2, 3], 5)
    d.step(finish_at_max=False)
    assert a.pending_token == 1000 and a.n_past == 3
    plan = s.step()
    assert plan.tokens == [1000] and a.n_past == 4
    s.undo_step(plan)
    assert (a.n_past, a.phase, a.pending_token, a.kv_tokens) == (3, Phase.DECODE, 1000, [1, 2, 3])
    assert s.take_pending_ops() == [KvTrim(a.seq_id, 3)]
    again = s.step()
    assert again.tokens == [1000] and again.positions == [3]


def test_a_step_whose_moved_chunk_follows_its_decode_cannot_be_taken_back() -> None:
    s = Scheduler(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    d = Driver(s)
    s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 1)
    d.run()
    s.add("after", FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9], 3, reuse_min=16)
    plan = s.step()
    assert not plan.undoable
    with pytest.raises(AssertionError, match="^a step whose moved chunk follows its decode cannot be taken back$"):
        s.undo_step(plan)


# ---- scheduler: add ---------------------------------------------------------------------------------------------


def test_add_keeps_the_requests_options_and_names_an_empty_prompt() -> None:
    s = Scheduler(n_ctx=100, batch_size=2, parallel=2, cache_slots=0)  # a batch as large as parallel is enough
    with pytest.raises(ValueError, match="^empty prompt$"):
        s.add("empty", [], 3)
    plain = s.add("plain", [1, 2], 3)
    assert plain.speculation is None and plain.use_cache and plain.reuse_min == 0
    special = s.add("special", [1, 2], 3, use_cache=False, reuse_min=4, speculative=True)
    assert special.speculation is not None and not special.use_cache and special.reuse_min == 4
    assert s.speculation is not None and s.step_cost is not None


# ---- scheduler: remove ------------------------------------------------------------------------------------------


def test_remove_keeps_an_entry_only_when_asked_and_there_is_something_to_keep() -> None:
    s = Scheduler(n_ctx=100, batch_size=2, parallel=2, cache_slots=2)
    d = Driver(s)
    waiting = s.add("waiting", [9], 3)
    s.remove(waiting)
    assert not s.waiting
    full, empty = s.add("full", [5, 5], 3), s.add("empty", [6] * 3, 3)
    d.step(finish_at_max=False)
    assert full.n_past == 2 and empty.phase is Phase.PREFILL and empty.n_past == 0  # the batch was full
    d.finish(empty)  # nothing computed: nothing to keep
    s.remove(full)  # not asked to keep it
    assert not s.cache and s.kv_cells_used == 0
    one = s.add("one", [1], 3)
    d.step(finish_at_max=False)
    d.finish(one)  # a single position: still an entry
    assert [e.tokens for e in s.cache.values()] == [(1,)] and s.kv_cells_used == 1
    zero = Scheduler(n_ctx=100, batch_size=2, parallel=2, cache_slots=0)
    dz = Driver(zero)
    kept = zero.add("kept", [1, 2], 3)
    dz.step(finish_at_max=False)
    dz.finish(kept)
    assert not zero.cache and sum(zero.evictions.values()) == 0 and zero.kv_cells_used == 0


# ---- scheduler: room for a step -------------------------------------------------------------------------------


def test_a_step_evicts_nothing_when_its_decode_tokens_fit_exactly_or_nothing_runs() -> None:
    s = Scheduler(n_ctx=16, batch_size=16, parallel=1, cache_slots=1)
    d = Driver(s)
    s.add("entry", [7] * 5, 1)
    d.run()
    a = s.add("a", [1] * 10, 4)
    d.step(finish_at_max=False)
    assert s.kv_cells_used == 15 and a.pending_token is not None
    d.step(finish_at_max=False)  # one decode token, one free cell
    assert len(s.cache) == 1 and sum(s.evictions.values()) == 0
    full = Scheduler(n_ctx=12, batch_size=16, parallel=1, cache_slots=2)
    df = Driver(full)
    for token in (7, 8):
        full.add(f"e{token}", [token] * 5, 2)
        df.run()
    assert full.kv_cells_used == 12 and len(full.cache) == 2
    plan = full.step()  # nothing runs: nothing to make room for
    assert plan.empty and len(full.cache) == 2


def test_the_last_row_of_a_batch_goes_to_a_prompt() -> None:
    s = Scheduler(n_ctx=400, batch_size=2, parallel=2, cache_slots=0)
    d = Driver(s)
    a = s.add("a", [1], 5)
    d.step(finish_at_max=False)
    b = s.add("b", [2] * 10, 3)
    plan = d.step(finish_at_max=False)  # a's decode token, and one row left: b's first prompt token
    assert plan.admitted == [b] and plan.prefilled_tokens == 1 and b.n_past == 1 and a.n_past == 2


def test_preemptions_are_counted_per_sequence_and_in_all_and_the_first_ones_output_is_remembered() -> None:
    s = Scheduler(n_ctx=60, batch_size=64, parallel=4, cache_slots=0, max_preemptions=3)
    d = Driver(s)
    seqs = [s.add(f"r{i}", [i + 1] * 6, 60 - 6) for i in range(4)]
    counted = {q.request_id: 0 for q in seqs}
    first_generated: dict[str, int] = {}
    while not s.idle():
        plan = d.step()
        for q in plan.preempted:
            counted[q.request_id] += 1
            first_generated.setdefault(q.request_id, q.generated)
    assert max(counted.values()) >= 2
    assert {q.request_id: q.preemptions for q in seqs} == counted and s.preemptions == sum(counted.values())
    assert {q.request_id: q.generated_at_first_preemption for q in seqs if q.preemptions} == first_generated
    assert all(d.output[q.request_id] == [1000 + g for g in range(q.max_tokens)] for q in seqs)


def test_a_prompt_alone_takes_the_last_free_cell_and_evicts_the_cache_when_none_is_left() -> None:
    s = Scheduler(n_ctx=37, batch_size=4, parallel=2, cache_slots=1)
    d = Driver(s)
    a = s.add("a", [1, 2, 3, 4], 6)
    d.step()
    b = s.add("b", [100 + i for i in range(30)], 2)
    for _ in range(8):  # a decodes to its end (a cache entry of 9 cells) while b prefills in chunks
        d.step()
    assert a.phase is Phase.DECODE and a not in s.running and len(s.cache) == 1
    assert (b.phase, b.n_past, s.free_cells) == (Phase.PREFILL, 27, 1)
    plan = d.step()  # nothing decodes: one cell is enough, and the chunk takes only that one
    assert plan.tokens == [127] and b.n_past == 28 and len(s.cache) == 1 and s.evictions["kv_cells"] == 0
    assert s.free_cells == 0
    plan = d.step()  # no cell left for the prompt: the cache goes
    assert s.evictions["kv_cells"] == 1 and plan.tokens == [128, 129] and b.phase is Phase.DECODE
    d.run()
    assert d.output["b"] == [1000, 1001]


def test_a_step_that_an_eviction_leaves_short_preempts_in_the_same_step() -> None:
    s = Scheduler(n_ctx=25, batch_size=8, parallel=2, cache_slots=1)
    d = Driver(s)
    s.add("entry", [9], 1)
    d.run()
    a, b = s.add("a", [1, 2, 3, 4], 20), s.add("b", [5, 6, 7, 8], 20)
    while s.free_cells:
        d.step()
    assert len(s.cache) == 1 and s.kv_cells_used == 25  # the entry's one cell and 12 each: 2 decode tokens need 2
    plan = d.step()
    assert s.evictions["kv_cells"] == 1 and plan.preempted == [b] and plan.tokens[0] == a.kv_tokens[-1]
    d.run()
    assert d.output["a"] == d.output["b"] == [1000 + i for i in range(20)]


def test_a_prompt_chunk_leaves_the_cells_a_pinned_sequence_may_still_fill() -> None:
    s = Scheduler(n_ctx=37, batch_size=4, parallel=3, cache_slots=0, max_preemptions=1)
    d = Driver(s)
    pinned = s.add("pinned", [1, 2, 3], 16)
    pinned.preemptions = 1  # as if preempted once: admitted with room for its whole answer
    other = s.add("other", [4, 5, 6], 20)
    d.step()
    b = s.add("b", [100 + i for i in range(12)], 2)
    progress = []
    for _ in range(9):
        d.step()
        progress.append(b.n_past)
        assert s.free_cells >= 0
    # Two decode tokens a step; b's chunks take what the pinned answer's 15 - k cells leave, then wait for cells.
    assert progress == [1, 3, 5, 7, 9, 10, 10, 10, 10]
    assert pinned.n_past == 12 and other.n_past == 11
    d.run()
    assert d.output["pinned"] == [1000 + i for i in range(16)] and d.output["b"] == [1000, 1001]


def test_the_newest_sequence_not_pinned_is_preempted_even_when_a_pinned_one_is_newer() -> None:
    s = Scheduler(n_ctx=56, batch_size=8, parallel=2, cache_slots=0, max_preemptions=1)
    d = Driver(s)
    a = s.add("a", [1, 2, 3, 4], 50)
    d.step()
    pinned = s.add("pinned", [5, 6, 7, 8], 30)
    pinned.preemptions = 1  # as if preempted once: admitted with room for its whole answer, never preempted again
    preempted = []
    while not preempted:
        preempted = d.step().preempted
    assert preempted == [a] and s.running == [pinned]
    assert (a.phase, a.seq_id, a.n_past, a.leader, a.shared) == (Phase.WAITING, -1, 0, None, 0)
    d.run()
    assert d.output["a"] == [1000 + i for i in range(50)] and d.output["pinned"] == [1000 + i for i in range(30)]


def test_a_step_with_nothing_to_compute_evicts_nothing_for_a_sequence_not_sampled_yet() -> None:
    s = Scheduler(n_ctx=12, batch_size=8, parallel=2, cache_slots=1)
    b = s.add("b", [5, 5, 5], 7)
    s.step()
    s.on_sampled(b, 100)
    a = s.add("a", [1, 2, 3], 5)
    while b.generated < 7:  # a's prompt is computed in the first of these steps, and a is never sampled
        s.step()
        s.on_sampled(b, 100 + b.generated)
    s.remove(b, keep_in_cache=True)
    assert (a.phase, a.pending_token, s.free_cells, len(s.cache)) == (Phase.DECODE, None, 0, 1)
    assert s.step().empty and len(s.cache) == 1 and sum(s.evictions.values()) == 0
