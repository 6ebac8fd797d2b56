"""Property tests (hypothesis): text assembly, stop matching, SSE framing, scheduler invariants."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from edge_llm.api.sse import encode_event
from edge_llm.engine.scheduling.scheduler import MAX_PREEMPTIONS, RequestTooLargeError, Scheduler
from edge_llm.engine.scheduling.sequence import Phase
from edge_llm.engine.scheduling.step_plan import KvCopy, KvRemove
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost
from edge_llm.engine.thread.text import OutputText, StopMatcher, Utf8Assembler

from .scheduler_model import Driver
from tests.helpers import parse_sse

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def split_at(data, cuts: list[int]):
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def split_bytes(draw, data_strategy):
    data = draw(data_strategy)
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=len(data) + 1))
    return data, split_at(data, cuts)


# ---- UTF-8 ------------------------------------------------------------------------------------

# bytes that are mostly pieces of real multi-byte characters, plus arbitrary bytes
utf8_ish = st.one_of(
    st.binary(max_size=48),
    st.text(max_size=24).map(lambda t: t.encode("utf-8")),
    st.lists(
        st.one_of(st.text(min_size=1, max_size=3).map(lambda t: t.encode("utf-8")), st.binary(min_size=1, max_size=2)),
        max_size=10,
    ).map(b"".join),
)


@FAST
@given(split_bytes(utf8_ish))
def test_utf8_assembler_equals_whole_decode_for_any_split(case) -> None:
    data, pieces = case
    assembler = Utf8Assembler()
    out = "".join(assembler.feed(p) for p in pieces) + assembler.flush()
    assert out == data.decode("utf-8", errors="replace")


@FAST
@given(split_bytes(st.text(max_size=24).map(lambda t: t.encode("utf-8"))))
def test_utf8_assembler_never_emits_a_replacement_for_valid_text(case) -> None:
    data, pieces = case
    assembler = Utf8Assembler()
    for piece in pieces:
        assert "\ufffd" not in assembler.feed(piece) or "\ufffd" in data.decode()
    assert assembler.flush() == "" or "\ufffd" in data.decode()


# ---- stop strings ------------------------------------------------------------------------------

ALPHABET = "ab<|>é日😀\n"
stop_text = st.text(alphabet=ALPHABET, max_size=30)
stop_list = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4)


def expected_output(text: str, stops: list[str], boundaries: list[int]) -> tuple[str, bool]:
    """What a streaming matcher must emit when `text` arrives in feeds ending at `boundaries`.

    Generation stops at the first feed after which a stop string is complete; the text is cut at
    the earliest start of any stop string complete by then. (A stop that could only complete in a
    later feed never counts: the model would not have generated that text.)
    """
    for end in boundaries:
        prefix = text[:end]
        hits = [prefix.find(s) for s in stops if s in prefix]
        if hits:
            return text[: min(hits)], True
    return text, False


def check_streamed(text: str, stops: list[str], emitted: str, stopped: bool, boundaries: list[int]) -> None:
    assert text.startswith(emitted)
    assert not any(s in emitted for s in stops), "a stop string leaked"
    if stopped:
        assert any(text[len(emitted) :].startswith(s) for s in stops), "not cut exactly where a stop starts"
    else:
        assert emitted == text
    assert (emitted, stopped) == expected_output(text, stops, boundaries)


@FAST
@given(stop_text, stop_list, st.data())
def test_stop_matcher_never_leaks_a_stop_for_any_split(text: str, stops: list[str], data) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))
    matcher = StopMatcher(stops)
    emitted = ""
    for piece in split_at(text, cuts):
        emitted += matcher.feed(piece)
        assert text.startswith(emitted)
        assert not any(s in emitted for s in stops)
    emitted += matcher.flush()
    check_streamed(text, stops, emitted, matcher.stopped, sorted(set(cuts) | {len(text)}))


@FAST
@given(stop_text, stop_list)
def test_stop_matcher_whole_text_cuts_at_the_earliest_stop(text: str, stops: list[str]) -> None:
    matcher = StopMatcher(stops)
    emitted = matcher.feed(text) + matcher.flush()
    hits = [text.find(s) for s in stops if s in text]
    assert emitted == (text[: min(hits)] if hits else text)
    assert matcher.stopped is bool(hits)


@FAST
@given(stop_text, stop_list, st.data())
def test_output_text_on_bytes_never_leaks_a_stop(text: str, stops: list[str], data) -> None:
    raw = text.encode("utf-8")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=len(raw) + 1))
    output = OutputText(stops)
    emitted = ""
    for piece in split_at(raw, cuts):
        emitted += output.feed(piece)
        assert text.startswith(emitted)
    emitted += output.finish()
    # a byte boundary is a text boundary after the last complete character
    boundaries = sorted({len(raw[:b].decode("utf-8", errors="ignore")) for b in cuts} | {len(text)})
    check_streamed(text, stops, emitted, output.stopped, boundaries)


# ---- SSE ---------------------------------------------------------------------------------------

event_names = st.one_of(st.none(), st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-", min_size=1, max_size=12))


@FAST
@given(st.text().filter(lambda t: "\r" not in t), event_names)
def test_sse_round_trip_for_text_without_cr(text: str, event: str | None) -> None:
    encoded = encode_event(text, event=event)
    assert encoded.endswith(b"\n\n")
    assert b"\n\n" not in encoded[:-2]
    assert parse_sse(encoded.decode("utf-8")) == [(event or "message", text)]


@FAST
@given(st.lists(st.tuples(st.text().filter(lambda t: "\r" not in t), event_names), max_size=6))
def test_sse_stream_of_events_round_trips(events) -> None:
    stream = b"".join(encode_event(text, event=name) for text, name in events).decode("utf-8")
    assert parse_sse(stream) == [(name or "message", text) for text, name in events]


@FAST
@given(st.text(alphabet="ab\r\n é", max_size=30))
def test_sse_carriage_returns_come_back_as_newlines(text: str) -> None:
    assert parse_sse(encode_event(text).decode()) == [("message", re.sub(r"\r\n|\r", "\n", text))]


# ---- scheduler ----------------------------------------------------------------------------------

BASES = ([], [1, 2, 3, 1, 2, 3], [2, 2, 2, 2], [1, 2, 3, 1, 3], [3, 1, 3, 1, 2, 2, 1, 3, 2, 1])
prompts = st.tuples(st.sampled_from(BASES), st.lists(st.integers(1, 3), min_size=1, max_size=8)).map(
    lambda parts: parts[0] + parts[1]
)  # shared beginnings, so that the prefix cache gets used

add_op = st.tuples(st.just("add"), prompts, st.integers(1, 6), st.booleans())  # the last: speculative
step_op = st.tuples(st.just("step"), st.integers(0, 255) | st.just(0), st.integers(1, 6))  # bit i: i-th sample is EOG
op = st.one_of(
    add_op,
    add_op,
    step_op,
    step_op,
    step_op,
    st.tuples(st.just("cancel"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("clear_cache")) | st.tuples(st.just("flush")),
)

# batch_size >= parallel: the Scheduler refuses fewer batch slots than sequences (ValueError), since every running
# sequence's decode token must fit in one batch.
configs = st.integers(1, 4).flatmap(
    lambda parallel: st.fixed_dictionaries(
        {
            "n_ctx": st.integers(16, 64),
            "batch_size": st.integers(max(2, parallel), 24),
            "parallel": st.just(parallel),
            "cache_slots": st.integers(0, 3),
        }
    )
)


def sample_token(sequence) -> int:
    return 1 + (sequence.generated + len(sequence.prompt)) % 3  # same alphabet as prompts: prefixes get shared


def engine_step(d: Driver, eog_mask: int) -> None:
    """One engine iteration: step, decode, sample (verifying drafts); finish on EOG or at max_tokens."""
    d.step_with_ends(eog_mask)
    drafted = [q.speculation.in_flight for q, _ in d.plans[-1].drafts]
    if drafted:
        event("drafted")


def streams(config: dict) -> dict:
    """The same scheduler with a KV stream per sequence (--deterministic): n_ctx split evenly."""
    n_seq = config["parallel"] + config["cache_slots"]
    stream = max(8, config["n_ctx"] // n_seq)
    return {**config, "n_ctx": stream * n_seq, "stream_cells": stream}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.lists(op, min_size=5, max_size=60))
def test_scheduler_invariants_over_random_operations(config, ops) -> None:
    run_random_operations(Scheduler(**config), ops)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs.map(streams), st.lists(op, min_size=5, max_size=60))
def test_scheduler_invariants_with_a_kv_stream_per_sequence(config, ops) -> None:
    run_random_operations(Scheduler(**config), ops)


def run_random_operations(s: Scheduler, ops: list) -> None:
    d = Driver(s, sample=sample_token)
    added = []
    cancelled = []
    for operation in ops:
        kind = operation[0]
        if kind == "add":
            _, prompt, max_tokens, speculative = operation
            if len(prompt) + max_tokens > s.sequence_context:
                try:
                    s.add(f"r{len(added)}", prompt, max_tokens)
                except RequestTooLargeError:
                    continue
                raise AssertionError("a request larger than the context was accepted")
            added.append(s.add(f"r{len(added)}", prompt, max_tokens, speculative=speculative))
        elif kind == "step":
            for _ in range(operation[2]):
                blocked = bool(s.waiting) and len(s.running) < s.parallel
                engine_step(d, operation[1])
                plan = d.plans[-1]
                if any(isinstance(o, KvCopy) for o in plan.kv_ops):
                    event("prefix copied")
                if blocked and s.waiting and s.waiting[0] not in plan.admitted:
                    event("head waits for KV budget")
                if any(q.leader is not None for q in s.running):
                    event("follower waits for its leader")
                d.check_invariants()
                d.check_coherent()
        elif kind == "cancel":
            live = list(s.waiting) + list(s.running)
            if live:
                victim = live[operation[1] % len(live)]
                was_running = victim.phase is not Phase.WAITING
                event(f"cancel during {victim.phase.value}")
                d.s.remove(victim, keep_in_cache=operation[2])
                cancelled.append(victim)
                assert victim not in s.running and victim not in s.waiting
                if was_running and not (operation[2] and s.cache_slots and victim.n_past):
                    assert victim.seq_id in s.kv.free_ids
        elif kind == "clear_cache":
            s.clear_cache()
            assert not s.cache
        else:
            d.flush_ops()
        d.check_invariants()
        d.check_coherent()
        # no sequence is lost: each is waiting, running, or has left exactly once
        gone = {id(q) for q in d.finished} | {id(q) for q in cancelled}
        for q in added:
            places = (q in s.waiting) + (q in s.running) + (id(q) in gone)
            assert places == 1, q
    # drain: everything left runs to completion (no deadlock, FIFO never starves anyone)
    for _ in range(2000):
        if s.idle():
            break
        engine_step(d, 0)
        d.check_invariants()
        d.check_coherent()
    assert s.idle()
    for q in added:
        assert q in d.finished or q in cancelled
        if q in d.finished and q not in cancelled:
            assert 0 <= q.generated <= q.max_tokens
            assert q.cached_tokens < len(q.prompt)
    s.clear_cache()
    d.flush_ops()
    assert sorted(s.kv.free_ids) == list(range(s.n_seq_max))
    assert s.kv_cells_used == 0
    assert not any(d.kv.seqs.values()), "KV cells left behind"


@settings(max_examples=300, deadline=None)
@given(configs | configs.map(streams),
       st.lists(st.tuples(prompts, st.integers(1, 8), st.booleans()), min_size=1, max_size=12),
       st.sampled_from([StepCost.linear(0.0), StepCost.linear(0.1), StepCost.linear(0.5), CPU_STEP_COST]))
def test_scheduler_completes_every_request_with_exactly_max_tokens(config, requests, step_cost) -> None:
    s = Scheduler(**config, step_cost=step_cost)
    d = Driver(s, sample=sample_token)
    seqs = [s.add(f"r{i}", p, m, speculative=spec) for i, (p, m, spec) in enumerate(requests)
            if len(p) + m <= s.sequence_context]
    admitted_order = []
    events: Counter[str] = Counter()
    for _ in range(3000):
        if s.idle():
            break
        running = list(s.running)
        # due to decode: a sampled token, or the prompt's last one once prompt[:-1] is in the KV cache
        decoding = [q for q in running if q.will_decode()]
        followers = [q for q in running if q.leader is not None]
        owners = {q.seq_id: q for q in running}
        plan = d.step()
        owners.update({q.seq_id: q for q in plan.admitted})
        admitted_order.extend(q for q in plan.admitted if q.preemptions == 0 and q not in admitted_order)
        decoding = [q for q in decoding if q not in plan.preempted]
        d.check_invariants()
        d.check_coherent()
        events.update(["drafted"] * bool(plan.drafts))
        events.update(["draft accepted"] * any(q.speculation.accepted for q, _ in plan.drafts))
        events.update(["draft rejected"] * any(q.speculation.accepted < q.speculation.drafted
                                               for q, _ in plan.drafts))
        # every sequence due to decode gets its token in the decode part; the only others there are ones whose
        # prompt[:-1] arrived at the start of this step (admitted, or a follower that copied its prefix); the others
        # sampled are those whose prompt chunk reached the end of their feed
        decode_part = Driver.decode_part(plan)
        decoded = [q for q, index in plan.samples if index < decode_part]
        assert set(decoding) <= set(decoded)
        assert set(decoded) - set(decoding) <= set(plan.admitted) | set(followers)
        assert decoded == [q for q in running + plan.admitted if q in decoded], "decode part in running order"
        # decode tokens (a generated token or the prompt's last) come before any prompt chunk token, with logits;
        # a chunk has logits only on its feed's last token, and that row is the sequence's sample
        feed_end = [len(owners[sid].feed) - 1 for sid in plan.seq_ids]
        assert all(plan.positions[i] >= feed_end[i] and plan.logits[i] for i in range(decode_part))
        chunk_rows = range(decode_part, len(plan.tokens))
        assert [plan.logits[i] for i in chunk_rows] == [plan.positions[i] == feed_end[i] for i in chunk_rows]
        assert [index for _, index in plan.samples if index >= decode_part] == [i for i in chunk_rows if plan.logits[i]]
        events.update(["chunk ends a prompt"] * (len(decoded) < len(plan.samples)))
        events.update(["copy"] * sum(isinstance(o, KvCopy) for o in plan.kv_ops))
        events.update(["remove"] * sum(isinstance(o, KvRemove) for o in plan.kv_ops))
        events.update(["chunked"] * any(q.n_past < len(q.prompt) for q in s.running))
        events.update(["follower"] * any(q.leader is not None for q in s.running))
        events.update(["preempted"] * len(plan.preempted))
    assert s.idle()
    assert admitted_order == seqs, "admission is FIFO"
    for q in seqs:
        # every token once, across preemptions: the same tokens as an uninterrupted run would sample
        assert d.output[q.request_id] == [1 + (g + len(q.prompt)) % 3 for g in range(q.max_tokens)]
        assert q.preemptions <= MAX_PREEMPTIONS
    for name in events:
        event(name)
