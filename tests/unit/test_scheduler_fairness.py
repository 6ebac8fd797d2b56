"""Admission fair between requests (engine/scheduling/admission.py): the choices of one request (`n`) share a group,
and the next sequence admitted is the oldest waiting one of the request with the fewest sequences running (ties: the
request that came first), a preempted one before any, and a head that does not fit is overtaken by nobody."""

from __future__ import annotations

from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence

from .scheduler_model import Driver


def make(**config: int) -> Driver:
    defaults = {"n_ctx": 1000, "batch_size": 64, "parallel": 2, "cache_slots": 0}
    return Driver(Scheduler(**(defaults | config)))


def choices(d: Driver, request: str, n: int, prompt: list[int], max_tokens: int) -> list[Sequence]:
    """The engine's sequences for one request with `n` choices (their ids differ, their group is the request's)."""
    return [d.s.add(f"{request}/{i}", prompt, max_tokens, group=request) for i in range(n)]


def test_a_later_request_is_not_queued_behind_the_extra_choices_of_an_earlier_one() -> None:
    d = make()
    many = choices(d, "many", 8, [1] * 4, 20)
    neighbour = d.s.add("neighbour", [2] * 3, 2)
    plan = d.step(finish_at_max=False)
    assert plan.admitted == [many[0], neighbour]
    assert list(d.s.waiting) == many[1:]
    d.check_invariants()


def test_a_request_arriving_while_another_holds_every_slot_gets_the_first_free_one() -> None:
    d = make()
    many = choices(d, "many", 8, [1] * 4, 20)
    assert d.step(finish_at_max=False).admitted == many[:2]
    late = d.s.add("late", [2] * 3, 2)
    d.finish(many[0], keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [late]
    assert list(d.s.waiting) == many[2:]
    d.finish(late, keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [many[2]], "then the request's next choice, in order"
    d.check_invariants()


def test_requests_with_as_many_running_go_first_come_first_served() -> None:
    d = make(parallel=4)
    a = choices(d, "a", 3, [1] * 4, 20)
    b = choices(d, "b", 3, [2] * 4, 20)
    c = d.s.add("c", [3] * 4, 20)
    assert d.step(finish_at_max=False).admitted == [a[0], b[0], c, a[1]]
    d.finish(c, keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [b[1]], "b has fewer running than a"
    d.finish(a[0], keep_in_cache=False)
    d.finish(b[0], keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [a[2], b[2]], "one each, a first: it came first"
    d.check_invariants()


def test_sequences_of_separate_requests_stay_first_in_first_out() -> None:
    d = make(parallel=1)
    seqs = [d.s.add(name, [i + 1] * 3, 2) for i, name in enumerate("abcd")]
    for expected in seqs:
        assert d.step(finish_at_max=False).admitted == [expected]
        d.finish(expected, keep_in_cache=False)


def test_the_fair_head_that_does_not_fit_is_overtaken_by_nobody() -> None:
    d = make(n_ctx=100, parallel=4)
    many = choices(d, "many", 2, [1] * 60, 30)
    big = d.s.add("big", [2] * 50, 10)  # the fair head once many/0 runs; it does not fit next to its 60 cells
    assert d.step(finish_at_max=False).admitted == [many[0]]
    for _ in range(5):
        plan = d.step(finish_at_max=False)
        assert plan.admitted == [], "many/1 would fit (it shares many/0's prompt) but must not overtake big"
        assert big.phase is Phase.WAITING and many[1].phase is Phase.WAITING
    d.finish(many[0], keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [many[1]], "none running each: many/1 came first"
    d.finish(many[1], keep_in_cache=False)
    assert d.step(finish_at_max=False).admitted == [big]
    d.check_invariants()


def test_a_preempted_sequence_resumes_before_a_request_with_fewer_running() -> None:
    d = make(n_ctx=64, parallel=3)
    pair = choices(d, "pair", 2, [1] * 10, 40)
    other = d.s.add("other", [2] * 10, 40)
    assert d.step(finish_at_max=False).admitted == [pair[0], other, pair[1]]
    for _ in range(200):
        plan = d.step(finish_at_max=False)
        if plan.preempted:
            break
    assert plan.preempted == [pair[1]]
    late = d.s.add("late", [4] * 3, 5)  # no sequence running: the fewest, but it came after the preemption
    d.finish(other, keep_in_cache=False)
    plan = d.step(finish_at_max=False)
    assert plan.admitted[0] is pair[1], "a preempted sequence keeps its turn"
    d.check_invariants()


def test_in_turn_lists_the_waiting_sequences_in_the_order_admission_takes_them() -> None:
    d = make(parallel=4)
    a = choices(d, "a", 3, [1] * 4, 20)
    b = d.s.add("b", [2] * 4, 20)
    c = choices(d, "c", 2, [3] * 4, 20)
    assert d.s.in_turn(0) == []
    assert d.s.in_turn(6) == [a[0], b, c[0], a[1], c[1], a[2]]
    assert d.s.in_turn(9) == [a[0], b, c[0], a[1], c[1], a[2]]
    assert list(d.s.waiting) == [*a, b, *c], "only looked at"
    assert d.step(finish_at_max=False).admitted == d.s.in_turn(0) + [a[0], b, c[0], a[1]]
    assert d.s.in_turn(2) == [c[1], a[2]]


def test_a_sequence_added_without_a_group_is_a_request_of_its_own() -> None:
    d = make()
    assert d.s.add("alone", [1], 1).group == "alone"
    assert d.s.add("x/1", [1], 1, group="x").group == "x"


def test_in_turn_counts_each_sequence_it_takes_as_one_more_running() -> None:
    d = make(parallel=4)
    first = d.s.add("a/0", [1] * 4, 20, group="a")
    assert d.step(finish_at_max=False).admitted == [first]
    b = choices(d, "b", 2, [2] * 4, 20)
    later = d.s.add("a/1", [1] * 4, 20, group="a")
    assert d.s.in_turn(3) == [b[0], b[1], later], "after b/0, one running each: b/1 is the older"
    assert d.step(finish_at_max=False).admitted == [b[0], b[1], later]
