"""KV cells on demand (engine/scheduling/scheduler.py, engine/scheduling/kv_ledger.py): shared prefixes count once, the prefix
cache goes before any running sequence, and preemption by recompute loses and repeats nothing."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from edge_llm.engine.scheduling.kv_ledger import KvLedger
from edge_llm.engine.scheduling.step_plan import KvCopy, KvRemove, KvShift, KvTrim
from edge_llm.engine.scheduling.scheduler import MAX_PREEMPTIONS, RequestTooLargeError, Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence

from .scheduler_model import Driver


def make(**config: int) -> Driver:
    defaults = {"n_ctx": 1000, "batch_size": 64, "parallel": 4, "cache_slots": 0}
    return Driver(Scheduler(**(defaults | config)))


def run_until(d: Driver, condition, steps: int = 500) -> None:
    for _ in range(steps):
        if condition():
            return
        d.step(finish_at_max=False)
    raise AssertionError("the condition never held")


# ---- the ledger ---------------------------------------------------------------------------------


def test_ledger_counts_a_shared_prefix_once() -> None:
    ledger = KvLedger()
    ledger.grow(0, 100)
    ledger.copy(0, 1, 60)
    ledger.copy(0, 2, 100)
    ledger.grow(1, 5)
    ledger.grow(2, 7)
    assert ledger.used == 100 + 5 + 7
    ledger.drop(0)
    assert ledger.used == 100 + 5 + 7  # 2 still holds all 100
    ledger.drop(2)
    assert ledger.used == 60 + 5
    assert ledger.used_without({1}) == 0
    ledger.drop(1)
    assert ledger.used == 0


def test_ledger_never_grows_an_orphaned_block_under_a_reused_seq_id() -> None:
    ledger = KvLedger()
    ledger.grow(3, 10)
    ledger.copy(3, 2, 4)
    ledger.drop(3)  # seq id 3 is free again; 2 still holds 4 cells of 3's block
    ledger.copy(2, 3, 1)
    ledger.grow(3, 1)  # the new holder of id 3 computes its own cell
    assert ledger.used == 4 + 1
    assert ledger.length(3) == 2


# ---- cells on demand ----------------------------------------------------------------------------


def test_eight_chats_sharing_a_system_prompt_with_a_generous_max_tokens_all_run_at_once() -> None:
    """The issue's case: a ~1,000-token system prompt, max_tokens 1024, an 8,192-cell context. Reserving
    prompt + max_tokens let 4 run; filled cells, with the prefix counted once, let all 8."""
    d = make(n_ctx=8192, batch_size=512, parallel=8, cache_slots=8)
    system = list(range(10, 1010))
    first = d.s.add("warm", system + [1, 2], 4)
    d.run()
    chats = [d.s.add(f"c{i}", system + [100 + i] * 10, 1024) for i in range(8)]
    plan = d.step(finish_at_max=False)
    assert plan.admitted == chats
    assert all(q.cached_tokens == 1000 for q in chats)
    run_until(d, lambda: all(q.generated >= 200 for q in chats))
    d.check_invariants()
    assert len(d.s.running) == 8 and not d.s.waiting and d.s.preemptions == 0
    distinct = len(first.kv_tokens) + sum(q.n_past - 1000 for q in chats)
    assert d.s.kv_cells_used == distinct < 8192 // 3


def test_a_running_sequence_is_preempted_only_after_the_prefix_cache_is_gone() -> None:
    d = make(n_ctx=64, batch_size=64, parallel=2, cache_slots=2)
    d.s.add("old", [9] * 10, 1)
    d.run()
    assert d.s.kv_cells_used == 10
    a = d.s.add("a", [1] * 20, 40)
    b = d.s.add("b", [2] * 20, 40)
    d.step(finish_at_max=False)
    assert d.s.running == [a, b]
    run_until(d, lambda: d.s.preemptions > 0 or not d.s.cache)
    assert d.s.preemptions == 0 and not d.s.cache
    assert d.s.evictions["kv_cells"] == 1
    run_until(d, lambda: d.s.preemptions > 0)
    d.check_invariants()


def test_preemption_takes_the_newest_sequence_which_resumes_first_and_loses_nothing() -> None:
    d = make(n_ctx=64, batch_size=64, parallel=3)
    a = d.s.add("a", [1] * 10, 40)
    b = d.s.add("b", [2] * 10, 40)
    c = d.s.add("c", [3] * 10, 40)
    d.step(finish_at_max=False)
    assert d.s.running == [a, b, c]
    for _ in range(200):
        plan = d.step(finish_at_max=False)
        if plan.preempted:
            break
    assert plan.preempted == [c]
    assert c.phase is Phase.WAITING and c.preemptions == 1 and list(d.s.waiting) == [c]
    assert KvRemove(2) in plan.kv_ops
    assert c.feed == c.prompt + c.output  # what it recomputes: its prompt and everything it generated
    late = d.s.add("late", [4] * 3, 5)
    d.finish(a, keep_in_cache=False)
    plan = d.step(finish_at_max=False)
    assert plan.admitted[0] is c, "a preempted sequence resumes before new arrivals"
    assert list(d.s.waiting) in ([late], [])
    d.s.remove(late)
    while not d.s.idle():
        d.step()  # check_sample_point: prompt + every output token once, at every sample
        d.check_invariants()
    assert d.output["c"] == [1000 + g for g in range(40)]


def test_the_oldest_sequence_is_never_preempted_and_a_lone_one_never() -> None:
    d = make(n_ctx=48, batch_size=64, parallel=3)
    seqs = [d.s.add(f"r{i}", [i + 1] * 8, 40 - 8) for i in range(3)]
    while not d.s.idle():
        d.step()
        d.check_invariants()
        assert seqs[0].preemptions == 0
    assert d.s.preemptions > 0
    assert all(d.output[q.request_id] == [1000 + g for g in range(q.max_tokens)] for q in seqs)


def test_a_sequence_preempted_max_preemptions_times_is_never_preempted_again() -> None:
    d = Driver(Scheduler(n_ctx=40, batch_size=64, parallel=4, cache_slots=0, max_preemptions=1))
    seqs = [d.s.add(f"r{i}", [i + 1] * 6, 40 - 6) for i in range(4)]
    while not d.s.idle():
        plan = d.step()
        d.check_invariants()
        for q in plan.admitted:
            if d.s.pinned(q):  # re-admitted with room for its whole answer
                assert d.s.kv_cells_used + d.s.pinned_growth() <= d.s.n_ctx
    assert max(q.preemptions for q in seqs) == 1
    assert all(d.output[q.request_id] == [1000 + g for g in range(q.max_tokens)] for q in seqs)


def test_a_request_that_can_never_fit_is_refused_before_decoding() -> None:
    s = Scheduler(n_ctx=100, batch_size=16, parallel=2, cache_slots=0)
    try:
        s.add("big", [1] * 95, 6)
    except RequestTooLargeError:
        return
    raise AssertionError("a request over the context was accepted")


# ---- moving a cached chunk (--cache-reuse) --------------------------------------------------------

FILE_HEAD, FILE_TAIL = list(range(100, 140)), list(range(200, 260))


def test_a_keystroke_moves_the_unchanged_rest_of_the_file_and_computes_only_the_edit() -> None:
    d = make(n_ctx=400, batch_size=64, parallel=2, cache_slots=2)
    first = d.s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL + [9], 3, reuse_min=16)
    d.run()
    assert set(d.s.cache) == {first.seq_id}
    edited = FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL + [9]  # three tokens typed after position 42
    after = d.s.add("after", edited, 3, reuse_min=16)
    d.step_with_ends(0, out_of_cells=True)  # even when the engine retries this batch after clearing the cache
    plan = d.plans[-1]
    assert after.seq_id == first.seq_id and not d.s.cache  # it took the entry over
    holder = plan.kv_ops[0].dst_seq  # a spare sequence holds the chunk while the typed tokens are computed
    assert plan.kv_ops == [KvCopy(first.seq_id, holder, start=42, end=42 + 60), KvTrim(first.seq_id, 42)]
    assert after.cached_tokens == 42 + 60 and after.moved_tokens == 60
    assert plan.prefilled_tokens == 3  # only the typed tokens; the last prompt token is decoded next
    assert not plan.undoable  # its chunk moves after the decode: a cancellation cannot stop this step
    assert after.moved is None and after.n_past == len(edited) - 1  # reached: the chunk moves after them
    # after this step's decode (a retry of this batch must not see the chunk yet: llama.cpp appends positions)
    assert d.s.kv.after_decode == [KvShift(holder, 42, 42 + 60, 3), KvCopy(holder, first.seq_id, start=45, end=45 + 60),
                                     KvRemove(holder)]
    d.check_coherent()
    d.check_invariants()
    while not d.s.idle():
        d.step()
        d.check_invariants()
    assert d.output["after"] == [1000, 1001, 1002]
    assert d.s.cache and list(next(iter(d.s.cache.values())).tokens) == edited + [1000, 1001]


def test_admission_counts_a_taken_over_entry_as_its_prefix_and_chunk() -> None:
    """In a context the whole entry and the new prompt would overflow, the take-over still fits: the entry's cells
    after the edit, but for the chunk, are freed by it (counting them would evict the entry and recompute all)."""
    d = make(n_ctx=200, batch_size=64, parallel=2, cache_slots=2)
    first = d.s.add("before", FILE_HEAD + [7, 8] + FILE_TAIL[:50] + FILE_TAIL + [9], 3, reuse_min=16)
    d.run()
    assert d.s.kv_cells_used == 155  # 153 prompt tokens and 2 decoded answer tokens
    edited = FILE_HEAD + [7, 8, 50, 51, 52] + FILE_TAIL[:50] + FILE_TAIL + [9]
    after = d.s.add("after", edited, 3, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [after] and after.seq_id == first.seq_id
    assert after.cached_tokens == len(edited) - 4 and d.s.evictions["kv_cells"] == 0
    d.check_invariants()
    d.run()


def test_no_chunk_is_moved_without_reuse_or_when_its_cells_are_shared() -> None:
    d = make(n_ctx=600, batch_size=64, parallel=3, cache_slots=3)
    base = FILE_HEAD + [7, 8] + FILE_TAIL + [9]
    d.s.add("before", base, 2, reuse_min=16)
    d.run()
    plain = d.s.add("plain", FILE_HEAD + [7, 8, 50] + FILE_TAIL + [9], 2)  # reuse_min 0: a plain prefix copy
    plan = d.step(finish_at_max=False)
    assert not any(isinstance(op, KvCopy) and op.start > 0 for op in plan.kv_ops) and plain.cached_tokens == 42
    d.finish(plain, keep_in_cache=False)
    d.run()
    assert len(d.s.cache) == 1
    # "twin" copies the whole entry (and its cells) before "edit" arrives in the same step: the chunk is shared
    twin = d.s.add("twin", base + [1000], 2, reuse_min=16)
    edit = d.s.add("edit", FILE_HEAD + [7, 8, 60] + FILE_TAIL + [9], 2, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [twin, edit]
    assert not any(isinstance(op, KvCopy) and op.start > 0 for op in plan.kv_ops)
    d.check_invariants()
    d.run()


def test_ledger_truncation_frees_what_nobody_else_holds() -> None:
    ledger = KvLedger()
    ledger.grow(0, 100)
    ledger.copy(0, 1, 30)
    assert ledger.other_holders_from(0, 20) and not ledger.other_holders_from(0, 30)
    ledger.truncate(0, 50)
    assert ledger.used == 50
    ledger.grow(0, 10)  # a moved chunk, then the prefill's own cells
    ledger.grow(0, 5)
    assert ledger.used == 65 and ledger.length(0) == 65
    ledger.drop(0)
    assert ledger.used == 30


# ---- the state machine ----------------------------------------------------------------------------

PREFIXES = ([], [1, 2, 3, 1, 2, 3], [2, 2, 2, 2, 2, 2, 2, 2, 3])


def sample_token(sequence: Sequence) -> int:
    return 1 + (sequence.generated + len(sequence.prompt)) % 3


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, prompt and answer lengths, early ends (an end token), cancellations and cache
    clears on a small context, so that eviction and preemption happen often."""

    @initialize(
        n_ctx=st.integers(16, 80),
        parallel=st.integers(1, 5),
        extra_batch=st.integers(0, 16),
        cache_slots=st.integers(0, 3),
        max_preemptions=st.integers(0, MAX_PREEMPTIONS),
    )
    def setup(self, n_ctx: int, parallel: int, extra_batch: int, cache_slots: int, max_preemptions: int) -> None:
        self.s = Scheduler(n_ctx=n_ctx, batch_size=parallel + extra_batch, parallel=parallel,
                           cache_slots=cache_slots, max_preemptions=max_preemptions)
        self.d = Driver(self.s, sample=sample_token)
        self.added: list[Sequence] = []
        self.ended: list[Sequence] = []

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(1, 3), min_size=1, max_size=12),
          max_tokens=st.integers(1, 40), reuse_min=st.sampled_from([0, 0, 2, 3]))
    def arrive(self, prefix: list[int], tail: list[int], max_tokens: int, reuse_min: int) -> None:
        prompt = prefix + tail
        if len(prompt) + max_tokens > self.s.n_ctx:
            max_tokens = self.s.n_ctx - len(prompt)
            if max_tokens < 1:
                return
        self.added.append(self.s.add(f"r{len(self.added)}", prompt, max_tokens, reuse_min=reuse_min))

    @rule(steps=st.integers(1, 8), end_mask=st.integers(0, 255), out_of_cells=st.integers(0, 255))
    def step(self, steps: int, end_mask: int, out_of_cells: int) -> None:
        for step in range(steps):  # bit i of out_of_cells: the i-th step's decode finds no cells and is retried
            self.ended += self.d.step_with_ends(end_mask, out_of_cells=bool(out_of_cells >> step & 1))

    @precondition(lambda self: self.s.waiting or self.s.running)
    @rule(index=st.integers(0, 50), keep=st.booleans())
    def cancel(self, index: int, keep: bool) -> None:
        live = list(self.s.waiting) + list(self.s.running)
        victim = live[index % len(live)]
        self.s.remove(victim, keep_in_cache=keep)
        self.ended.append(victim)

    @rule()
    def clear_cache(self) -> None:
        self.s.clear_cache()

    def _engine_step(self, end_mask: int) -> None:
        self.ended += self.d.step_with_ends(end_mask)

    @invariant()
    def cells_and_places(self) -> None:
        if not hasattr(self, "s"):
            return
        self.d.check_invariants()  # ledger == distinct cells in use <= context, seq ids, phases
        self.d.check_coherent()
        ended = {id(q) for q in self.ended}
        for q in self.added:
            assert (q in self.s.waiting) + (q in self.s.running) + (id(q) in ended) == 1, q
            assert q.preemptions <= self.s.max_preemptions
        assert [q for q in self.s.waiting if q.preemptions] == list(self.s.waiting)[: sum(
            1 for q in self.s.waiting if q.preemptions)], "preempted sequences wait ahead of new arrivals"

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(5000):
            if self.s.idle():
                break
            self._engine_step(0)
            self.cells_and_places()
        assert self.s.idle(), "every admitted sequence finishes or is cancelled"
        for q in self.added:
            produced = self.d.output.get(q.request_id, [])
            assert produced == [1 + (g + len(q.prompt)) % 3 for g in range(len(produced))], "a token repeated or lost"
            if q not in self.ended or (q.generated >= q.max_tokens):
                assert len(produced) == q.max_tokens or q in self.ended


SchedulerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_scheduler_state_machine = SchedulerMachine.TestCase


def test_older_cache_entries_sharing_a_chunk_are_evicted_so_that_it_can_move() -> None:
    """Keystrokes in the typed line append, so each entry shares the file's cells with the one before; on the next
    line the chunk is moved all the same: the older entries, not running sequences, give their share up."""
    d = make(n_ctx=600, batch_size=64, parallel=2, cache_slots=3)
    base = FILE_HEAD + [7, 8] + FILE_TAIL + [9]
    older = d.s.add("older", base, 2, reuse_min=16)
    d.run()
    newer = d.s.add("newer", base + [5, 6], 2, reuse_min=16)  # shares "older"'s prompt cells, then its own
    d.run()
    assert len(d.s.cache) == 2 and d.s.kv.ledger.other_holders_from(newer.seq_id, 42)
    edited = FILE_HEAD + [7, 8, 60, 61] + FILE_TAIL + [9]
    after = d.s.add("after", edited, 2, reuse_min=16)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [after] and after.cached_tokens == 42 + 60
    assert any(isinstance(op, KvCopy) and op.start > 0 for op in plan.kv_ops)  # the chunk moved
    assert d.s.evictions["moved_chunk"] == 1 and older.seq_id not in d.s.cache
    d.check_coherent()
    d.check_invariants()
    d.run()


def test_planning_a_move_changes_nothing_until_it_is_made() -> None:
    """The entries a move outdates are named by the plan and evicted only when the head takes the entry over (so a
    head that then waits, or is admitted otherwise, loses nothing)."""
    d = make(n_ctx=600, batch_size=64, parallel=2, cache_slots=3)
    base = FILE_HEAD + [7, 8] + FILE_TAIL + [9]
    d.s.add("older", base, 2, reuse_min=16)
    d.run()
    d.s.add("newer", base + [5, 6], 2, reuse_min=16)
    d.run()
    edited = FILE_HEAD + [7, 8, 60, 61] + FILE_TAIL + [9]
    head = Sequence("after", edited, 2, feed=edited, reuse_min=16)
    cache, used = dict(d.s.cache), d.s.kv.ledger.used
    match = d.s.cached.best_prefix(head.feed)
    move = d.s.moves.movable(head, match, d.s.sharing.best_leader(head))
    assert move is not None and (move.old_start, move.start) == (42, 44)
    assert len(cache) == 2 and move.outdated == set(cache) - {match[0].seq_id}  # the older keystroke's entry
    assert dict(d.s.cache) == cache and d.s.kv.ledger.used == used and d.s.evictions["moved_chunk"] == 0
