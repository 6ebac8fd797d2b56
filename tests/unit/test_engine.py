"""The engine thread (engine/thread/worker.py) with a scripted fake runner: no model, no llama_cpp."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

import pytest

from edge_llm.engine.thread.channel import ReplyChannel
from edge_llm.engine.scheduling.step_plan import KvCopy, KvRemove, StepPlan
from edge_llm.engine.types import (
    EngineUnavailableError,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    OutOfCellsError,
    QueueFullError,
    SamplingParams,
    StepAbortedError,
    TextDelta,
)
from edge_llm.engine.thread.worker import Engine

from .scheduler_model import KvModel

EOG = 0
TIMEOUT = 5.0


class FakeSampler:
    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.closed = False
        self.seq_id: int | None = None
        self.samples = 0

    def close(self) -> None:
        assert not self.closed, "sampler closed twice"
        self.closed = True


class FakeRunner:
    """Implements the engine's Runner protocol.

    `scripts[seed]` is the token list a request with SamplingParams(seed=seed) samples, in order.
    Token 0 is end-of-generation; `pieces` maps tokens to bytes (default: b"<t>").
    With `gated()`, every decode waits for a permit, so a test can move the engine one step at a time.
    """

    def __init__(self, scripts: dict[int, list[int]], pieces: dict[int, bytes] | None = None, *, n_seq_max: int = 16):
        self.scripts = scripts
        self.pieces = pieces or {}
        self.kv = KvModel(n_seq_max)
        self.plans: list[StepPlan] = []
        self.samplers: list[FakeSampler] = []
        self.closed = False
        self.fail_decode: Callable[[int], BaseException | None] = lambda n: None
        self.batch_size = 1 << 30
        self._gate: threading.Semaphore | None = None
        self._entered = 0
        self._cond = threading.Condition()
        self._last_plan: StepPlan | None = None
        self.decode_calls = 0  # decode calls let through (gated: those given a permit)
        self.entered: list[StepPlan] = []  # the plan of every decode call, as it starts (before its gate)
        self._decoding = False
        self.close_thread: str | None = None
        self.abort_flag = False
        self.closed_during_decode: bool | None = None

    # ---- test controls ----
    def gated(self) -> FakeRunner:
        self._gate = threading.Semaphore(0)
        return self

    def allow(self, n: int = 1) -> None:
        assert self._gate is not None
        for _ in range(n):
            self._gate.release()

    def open(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.release(1000)

    def wait_for_kv(self, predicate: Callable[[], bool]) -> None:
        """Waits until the KV ops applied so far satisfy `predicate` (each apply_kv_ops notifies)."""
        with self._cond:
            assert self._cond.wait_for(predicate, TIMEOUT), "the KV ops never came"

    def wait_blocked(self, n: int) -> None:
        """Waits until the n-th decode call has started (and, when gated, is waiting for a permit)."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._entered >= n, TIMEOUT), f"decode #{n} never came"

    # ---- the Runner protocol ----
    def arm_abort(self) -> None:
        self.abort_flag = False

    def abort_step(self) -> None:
        self.abort_flag = True

    def decode(self, plan: StepPlan) -> None:
        self._decoding = True
        try:
            self._decode(plan)
        finally:
            self._decoding = False

    def _decode(self, plan: StepPlan) -> None:
        with self._cond:
            self._entered += 1
            self.entered.append(plan)
            self._cond.notify_all()
        gate = self._gate
        if gate is not None:
            assert gate.acquire(timeout=TIMEOUT), "test forgot to allow a decode"
        self.decode_calls += 1
        error = self.fail_decode(self.decode_calls)
        if error is not None:
            raise error
        if self.abort_flag:  # as llama.cpp: the batch's cells are not kept
            raise StepAbortedError("stopped")
        self.kv.decode(plan, self.batch_size)
        self.plans.append(plan)
        self._last_plan = plan

    def new_sampler(self, params: SamplingParams) -> FakeSampler:
        sampler = FakeSampler(self.scripts[params.seed])
        self.samplers.append(sampler)
        return sampler

    def sample(self, sampler: FakeSampler, batch_index: int) -> int:
        plan = self._last_plan
        assert plan is not None and plan.logits[batch_index], "sampled where no logits were asked for"
        seq_id = plan.seq_ids[batch_index]
        if sampler.seq_id is None:
            sampler.seq_id = seq_id
        assert sampler.seq_id == seq_id, "a request sampled another sequence's logits"
        assert not sampler.closed
        sampler.samples += 1
        return sampler.script.pop(0) if sampler.script else EOG

    def piece(self, token: int) -> bytes:
        return self.pieces.get(token, f"<{token}>".encode())

    def is_end_of_generation(self, token: int) -> bool:
        return token == EOG

    def apply_kv_ops(self, ops) -> None:
        ops = list(ops)
        self.kv.apply_ops(ops)
        with self._cond:
            self._cond.notify_all()
        for op in ops:  # a preempted request resumes under another sequence id
            if isinstance(op, KvRemove):
                for sampler in self.samplers:
                    if sampler.seq_id == op.seq_id and not sampler.closed:
                        sampler.seq_id = None

    def close(self) -> None:
        # What freeing the model would race with: checked by the lifecycle tests.
        self.close_thread = threading.current_thread().name
        self.closed_during_decode = self._decoding
        self.closed = True


@pytest.fixture
def make_engine():
    engines: list[tuple[Engine, FakeRunner]] = []

    def make(runner: FakeRunner, *, n_ctx=256, batch_size=64, parallel=2, cache_slots=0, queue_capacity=8) -> Engine:
        engine = Engine(
            lambda: runner,
            n_ctx=n_ctx,
            batch_size=batch_size,
            parallel=parallel,
            cache_slots=cache_slots,
            queue_capacity=queue_capacity,
        )
        runner.batch_size = batch_size
        engine.start()
        assert engine.wait_loaded(TIMEOUT)
        assert engine.ready
        engines.append((engine, runner))
        return engine

    yield make
    for engine, runner in engines:
        runner.open()
        assert engine.stop(timeout=TIMEOUT), "the engine thread did not end"


def request(rid: str, seed: int, prompt: list[int] | None = None, max_tokens: int = 16, stop=()) -> GenerationRequest:
    return GenerationRequest(rid, prompt or [1, 2, 3], max_tokens, SamplingParams(seed=seed), tuple(stop))


async def collect(channel: ReplyChannel) -> list:
    async def run():
        return [event async for event in channel]

    return await asyncio.wait_for(run(), TIMEOUT)


def text_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def last(events):
    assert events, "no events"
    assert all(isinstance(e, TextDelta) for e in events[:-1])
    return events[-1]


def submit(engine: Engine, req: GenerationRequest) -> ReplyChannel:
    channel = ReplyChannel()
    engine.submit(req, channel)
    return channel


# ---- normal generation ----------------------------------------------------------------------------


def test_every_request_gets_its_own_text_then_finished(make_engine) -> None:
    scripts = {1: [11, 12, 13, EOG], 2: [21, 22, EOG], 3: [31, 32, 33, 34, 35, EOG], 4: [EOG]}
    runner = FakeRunner(scripts)
    engine = make_engine(runner, parallel=2)

    async def main():
        channels = [submit(engine, request(f"r{i}", i, prompt=[i, i + 1, i + 2])) for i in scripts]
        return await asyncio.gather(*(collect(c) for c in channels))

    results = asyncio.run(main())
    for seed, events in zip(scripts, results):
        expected = "".join(f"<{t}>" for t in scripts[seed] if t != EOG)
        assert text_of(events) == expected
        finished = last(events)
        assert isinstance(finished, Finished)
        assert finished.reason is FinishReason.STOP
        assert finished.usage.prompt_tokens == 3
        assert finished.usage.completion_tokens == len(scripts[seed]) - 1
        assert finished.usage.total_tokens == 3 + len(scripts[seed]) - 1
        assert set(finished.timings) == {"queue_ms", "prefill_ms", "decode_ms"}
        counts = [e.token_count for e in events if isinstance(e, TextDelta)]
        assert counts == list(range(1, len(counts) + 1))
    assert all(s.closed for s in runner.samplers)
    # never more than `parallel` sequences in one batch
    assert max(len(set(p.seq_ids)) for p in runner.plans) == 2
    assert engine.stats().running == 0 and engine.stats().waiting == 0


def test_max_tokens_finishes_with_length(make_engine) -> None:
    runner = FakeRunner({1: list(range(10, 30))})
    engine = make_engine(runner)

    async def main():
        return await collect(submit(engine, request("r", 1, max_tokens=4)))

    events = asyncio.run(main())
    assert text_of(events) == "<10><11><12><13>"
    finished = last(events)
    assert finished.reason is FinishReason.LENGTH
    assert finished.usage.completion_tokens == 4
    assert runner.samplers[0].samples == 4


def test_stop_string_split_across_tokens(make_engine) -> None:
    pieces = {10: b"Hel", 11: b"lo E", 12: b"N", 13: b"D and more", 14: b"never"}
    runner = FakeRunner({1: [10, 11, 12, 13, 14]}, pieces)
    engine = make_engine(runner)

    async def main():
        return await collect(submit(engine, request("r", 1, stop=["END"])))

    events = asyncio.run(main())
    assert text_of(events) == "Hello "
    for event in events:
        if isinstance(event, TextDelta):
            assert "E" not in event.text and "N" not in event.text
    finished = last(events)
    assert finished.reason is FinishReason.STOP
    assert finished.usage.completion_tokens == 4


def test_held_back_stop_prefix_is_released_at_the_end(make_engine) -> None:
    runner = FakeRunner({1: [10, 11, EOG]}, {10: b"a", 11: b" </"})
    engine = make_engine(runner)

    async def main():
        return await collect(submit(engine, request("r", 1, stop=["</s>"])))

    events = asyncio.run(main())
    assert text_of(events) == "a </"
    assert last(events).reason is FinishReason.STOP


def test_multibyte_character_split_across_tokens(make_engine) -> None:
    emoji = "😀".encode()
    pieces = {10: b"x" + emoji[:1], 11: emoji[1:3], 12: emoji[3:], 13: "é".encode()[:1]}
    runner = FakeRunner({1: [10, 11, 12, 13, EOG]}, pieces)
    engine = make_engine(runner)

    async def main():
        return await collect(submit(engine, request("r", 1)))

    events = asyncio.run(main())
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert deltas == ["x", "😀", "\ufffd"]  # the dangling byte is flushed as U+FFFD at the end
    assert last(events).reason is FinishReason.STOP


def test_request_larger_than_the_context_fails(make_engine) -> None:
    runner = FakeRunner({1: [EOG]})
    engine = make_engine(runner, n_ctx=32)

    async def main():
        return await collect(submit(engine, request("r", 1, prompt=[1] * 30, max_tokens=5)))

    events = asyncio.run(main())
    assert len(events) == 1
    assert isinstance(events[0], Failed)
    assert events[0].code == "context_length_exceeded"
    assert engine.stats().waiting == 0


def test_prefix_cache_reports_cached_tokens(make_engine) -> None:
    runner = FakeRunner({1: [10, EOG], 2: [20, EOG], 3: [EOG]})
    engine = make_engine(runner, cache_slots=2)
    prompt = list(range(1, 11))

    async def main():
        first = await collect(submit(engine, request("a", 1, prompt=prompt)))
        # a's entry holds its prompt and the token it decoded (<10>); the EOG was never decoded
        second = await collect(submit(engine, request("b", 2, prompt=prompt + [10, 99])))
        third = await collect(submit(engine, request("c", 3, prompt=prompt[:4] + [77])))
        return first, second, third

    first, second, third = asyncio.run(main())
    assert last(first).usage.cached_tokens == 0
    assert last(second).usage.cached_tokens == 11
    assert last(second).usage.prompt_tokens == 12
    assert last(third).usage.cached_tokens == 4
    copies = [op for op in runner.kv.log if isinstance(op, KvCopy)]
    assert [op.end for op in copies] == [11, 4]
    # only the uncached prompt tokens were decoded for b
    b_seq = runner.samplers[1].seq_id
    b_prefill = [t for p in runner.plans for t, s in zip(p.tokens, p.seq_ids) if s == b_seq]
    assert b_prefill[0] == 99


def test_out_of_cells_clears_the_cache_and_retries(make_engine) -> None:
    runner = FakeRunner({1: [10, EOG], 2: [20, 21, EOG]})
    engine = make_engine(runner, cache_slots=2)

    async def main():
        first = await collect(submit(engine, request("a", 1, prompt=[1, 2, 3])))
        calls = runner.decode_calls
        runner.fail_decode = lambda n: OutOfCellsError("full") if n == calls + 1 else None
        second = await collect(submit(engine, request("b", 2, prompt=[7, 8, 9])))
        return first, second

    first, second = asyncio.run(main())
    assert text_of(second) == "<20><21>"
    assert last(second).reason is FinishReason.STOP
    cached_seq = runner.samplers[0].seq_id
    assert KvRemove(cached_seq) in runner.kv.log
    assert engine.stats().cached_sequences == 1  # only b's entry, a's was dropped


# ---- capacity and cancellation ------------------------------------------------------------------------


def test_preempted_requests_stream_every_token_once_and_report_the_recompute(make_engine) -> None:
    """Three answers of 30 tokens on 6-token prompts need 108 cells of a 40-cell context: sequences are
    preempted and resumed, and each client still gets its whole text once, with one usage."""
    scripts = {seed: [100 * seed + g for g in range(1, 31)] for seed in (1, 2, 3)}
    runner = FakeRunner(scripts)
    engine = make_engine(runner, n_ctx=40, parallel=3)

    async def main():
        channels = [submit(engine, request(f"r{i}", i, prompt=[i] * 6, max_tokens=30)) for i in scripts]
        return await asyncio.gather(*(collect(c) for c in channels))

    results = asyncio.run(main())
    preempted = 0
    for seed, events in zip(scripts, results):
        assert text_of(events) == "".join(f"<{t}>" for t in scripts[seed])
        finished = last(events)
        assert isinstance(finished, Finished) and finished.reason is FinishReason.LENGTH
        assert finished.usage.completion_tokens == 30 and finished.usage.prompt_tokens == 6
        if "preemptions" in finished.timings:
            preempted += 1
            assert finished.timings["recompute_ms"] >= 0
            assert finished.timings["decode_ms"] >= finished.timings["recompute_ms"]
    assert preempted >= 1
    assert engine.stats().preemptions >= preempted
    assert engine.stats().kv_cells_used == 0


def test_a_step_whose_every_request_is_cancelled_stops_and_is_taken_back(make_engine) -> None:
    """An editor's stale completion is cancelled while its step decodes: the decode stops (llama.cpp keeps none of
    its cells), the sequence lets that step's positions go, and its cache entry is what the KV cache holds, so the
    next keystroke's request finds its prefix."""
    runner = FakeRunner({1: [10, 11, 12, 13, 14, 15], 2: [20, 21, EOG], 3: [30, EOG]}).gated()
    engine = make_engine(runner, parallel=2, cache_slots=2)

    async def main():
        stale = submit(engine, request("stale", 1, prompt=[1, 2, 3, 4, 5, 6], max_tokens=6))
        runner.allow(2)
        runner.wait_blocked(3)  # its third step decodes (the prompt, sampled at its end, then two tokens)
        engine.abort("stale")
        runner.allow(1)  # that decode finds the flag set and stops
        nxt = submit(engine, request("next", 2, prompt=[1, 2, 3, 4, 5, 6, 7, 8]))  # after the abort in the inbox
        runner.open()
        return await collect(stale), await collect(nxt)

    stale, nxt = asyncio.run(main())
    assert last(stale).reason is FinishReason.CANCELLED
    assert last(nxt).reason is FinishReason.STOP and text_of(nxt) == "<20><21>"
    assert engine.stats().aborted_steps == 1
    assert last(nxt).usage.cached_tokens == 6
    # The KV cache holds the stale request's prompt and the token decoded before the stopped step, and its cache
    # entry claims no more: a request going on with the token of the stopped step reuses 7 tokens, not 8.
    assert [1, 2, 3, 4, 5, 6, 10] in runner.kv.seqs.values()

    async def going_on() -> list:
        return await collect(submit(engine, request("after", 3, prompt=[1, 2, 3, 4, 5, 6, 10, 11, 12])))

    after = asyncio.run(going_on())
    assert last(after).usage.cached_tokens == 7 and text_of(after) == "<30>"


def test_a_step_with_a_request_still_wanted_runs_to_its_end(make_engine) -> None:
    runner = FakeRunner({1: [10] * 8, 2: [20, 21, 22, EOG]}).gated()
    engine = make_engine(runner, parallel=2)

    async def main():
        a = submit(engine, request("a", 1, max_tokens=8))
        b = submit(engine, request("b", 2))
        runner.allow(2)
        runner.wait_blocked(3)  # both decode in this step
        engine.abort("a")
        runner.open()
        return await collect(a), await collect(b)

    a, b = asyncio.run(main())
    assert last(a).reason is FinishReason.CANCELLED
    assert text_of(b) == "<20><21><22>" and engine.stats().aborted_steps == 0


def test_queue_capacity_raises_queue_full(make_engine) -> None:
    runner = FakeRunner({1: [10] * 50, 2: [EOG], 3: [EOG], 4: [EOG]}).gated()
    engine = make_engine(runner, parallel=1, queue_capacity=2)

    async def main():
        a = submit(engine, request("a", 1, max_tokens=50))
        runner.wait_blocked(1)  # a is admitted and decoding
        b = submit(engine, request("b", 2))
        c = submit(engine, request("c", 3))
        assert engine.stats().waiting == 2
        with pytest.raises(QueueFullError):
            submit(engine, request("d", 4))
        engine.abort("b")
        runner.allow(1)
        runner.wait_blocked(2)  # the abort was handled: a queue place is free again
        assert engine.stats().waiting == 1
        d = submit(engine, request("d", 4))
        runner.open()
        return await asyncio.gather(collect(a), collect(b), collect(c), collect(d))

    a, b, c, d = asyncio.run(main())
    assert last(a).reason is FinishReason.LENGTH
    assert last(b).reason is FinishReason.CANCELLED
    assert b == [last(b)]
    assert last(c).reason is FinishReason.STOP
    assert last(d).reason is FinishReason.STOP


def test_abort_while_waiting(make_engine) -> None:
    runner = FakeRunner({1: [10, 11, 12, EOG], 2: [20, EOG]}).gated()
    engine = make_engine(runner, parallel=1)

    async def main():
        a = submit(engine, request("a", 1))
        runner.wait_blocked(1)
        b = submit(engine, request("b", 2))
        runner.allow(1)
        runner.wait_blocked(2)  # b has been added to the scheduler and waits behind a
        assert engine.stats().waiting == 1 and engine.stats().running == 1
        engine.abort("b")
        runner.allow(1)
        runner.wait_blocked(3)
        assert engine.stats().waiting == 0
        runner.open()
        return await collect(a), await collect(b)

    a, b = asyncio.run(main())
    assert text_of(a) == "<10><11><12>"
    assert len(b) == 1
    assert b[0].reason is FinishReason.CANCELLED
    assert b[0].usage.completion_tokens == 0
    assert runner.samplers[1].closed and runner.samplers[1].samples == 0
    assert engine.stats().running == 0 and engine.stats().waiting == 0
    assert all(len(set(plan.seq_ids)) == 1 for plan in runner.entered)  # b never ran beside a


def test_abort_during_prefill_frees_the_sequence(make_engine) -> None:
    runner = FakeRunner({1: [10, EOG]}).gated()
    engine = make_engine(runner, batch_size=4, parallel=1, cache_slots=0)

    async def main():
        a = submit(engine, request("a", 1, prompt=list(range(1, 13))))  # prompt[:-1]: chunks of 4, 4, 3
        runner.wait_blocked(1)
        (seq_id,) = set(runner.entered[0].seq_ids)  # the prefill's first chunk, blocked in decode
        engine.abort("a")
        runner.allow(1)
        events = await collect(a)
        return seq_id, events

    seq_id, events = asyncio.run(main())
    assert events == [last(events)]
    assert events[0].reason is FinishReason.CANCELLED
    assert events[0].usage.completion_tokens == 0
    assert runner.plans == [] and engine.stats().aborted_steps == 1  # its prefill decode was stopped, not finished
    runner.wait_for_kv(lambda: KvRemove(seq_id) in runner.kv.log)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.cached_sequences, stats.kv_cells_used) == (0, 0, 0, 0)
    assert not runner.kv.seqs.get(seq_id)


def test_abort_during_decode_frees_the_sequence(make_engine) -> None:
    runner = FakeRunner({1: list(range(10, 60))}).gated()
    engine = make_engine(runner, parallel=2, cache_slots=0)

    async def main():
        a = submit(engine, request("a", 1, max_tokens=40))
        runner.allow(3)
        # the prompt (its first sample at its last token) and 2 more decode steps done, the 4th decode waits
        runner.wait_blocked(4)
        assert [len(p.samples) for p in runner.plans] == [1, 1, 1]
        (seq_id,) = set(runner.entered[-1].seq_ids)  # the 4th decode, blocked
        engine.abort("a")
        runner.allow(1)
        return seq_id, await collect(a)

    seq_id, events = asyncio.run(main())
    finished = last(events)
    assert finished.reason is FinishReason.CANCELLED
    assert text_of(events) == "<10><11><12>"  # the 4th decode was stopped: nothing after the abort is sampled
    assert finished.usage.completion_tokens == 3
    runner.wait_for_kv(lambda: KvRemove(seq_id) in runner.kv.log)
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_cells_used) == (0, 0, 0)
    assert runner.samplers[0].closed


def test_abort_of_an_unknown_or_finished_request_is_harmless(make_engine) -> None:
    runner = FakeRunner({1: [10, EOG], 2: [20, EOG]})
    engine = make_engine(runner)

    async def main():
        engine.abort("nobody")
        first = await collect(submit(engine, request("a", 1)))
        engine.abort("a")
        second = await collect(submit(engine, request("b", 2)))
        return first, second

    first, second = asyncio.run(main())
    assert last(first).reason is FinishReason.STOP
    assert text_of(second) == "<20>"


# ---- lifecycle ------------------------------------------------------------------------------------------


def test_stop_fails_pending_requests(make_engine) -> None:
    runner = FakeRunner({1: [10] * 100, 2: [EOG]}).gated()
    engine = make_engine(runner, parallel=1)
    exits = []
    engine.set_exit_handler(exits.append)

    async def main():
        a = submit(engine, request("a", 1, max_tokens=100))
        runner.wait_blocked(1)
        b = submit(engine, request("b", 2))
        engine.stop(timeout=0)
        assert not engine.ready
        with pytest.raises(EngineUnavailableError):
            submit(engine, request("c", 2))
        runner.open()
        return await collect(a), await collect(b)

    a, b = asyncio.run(main())
    for events in (a, b):
        failed = last(events)
        assert isinstance(failed, Failed)
        assert failed.code == "shutting_down"
        assert "shutting down" in failed.message
    assert engine.stop(timeout=TIMEOUT), "the engine thread did not end"  # it was ending: stop() waits for it
    assert runner.closed
    assert all(s.closed for s in runner.samplers)
    assert exits == [None]
    assert engine.stats().waiting == 0


def test_stop_that_times_out_during_a_decode_frees_the_model_only_after_it(make_engine) -> None:
    runner = FakeRunner({1: [10] * 100}).gated()
    engine = make_engine(runner, parallel=1)

    async def main():
        a = submit(engine, request("a", 1, max_tokens=100))
        runner.wait_blocked(1)  # the engine thread is inside llama_decode (a long prefill)
        assert engine.stop(timeout=0) is False  # the join timed out
        assert not runner.closed and not runner.samplers[0].closed  # nothing freed under the decode
        runner.open()
        return await collect(a)

    events = asyncio.run(main())
    assert isinstance(last(events), Failed) and last(events).code == "shutting_down"
    assert engine.stop(timeout=TIMEOUT), "the engine thread did not end"  # it was ending: stop() waits for it
    assert runner.closed and runner.closed_during_decode is False
    assert runner.close_thread == "edge-llm-engine"
    assert all(s.closed for s in runner.samplers)


class _ContendedLock:
    """A lock that sets `contended` when a thread has to wait for it."""

    def __init__(self, contended: threading.Event) -> None:
        self._lock = threading.Lock()
        self.contended = contended

    def __enter__(self) -> _ContendedLock:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _PausingInbox(queue.SimpleQueue):
    """An inbox whose first `submit` put waits for `resume`: the submitting thread is stopped between
    its checks (ready, queue capacity) and the put."""

    def __init__(self) -> None:
        self.paused = threading.Event()
        self.resume = threading.Event()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        if item[0] == "submit" and not self.paused.is_set():
            self.paused.set()
            assert self.resume.wait(TIMEOUT), "the test never resumed the submit"
        super().put(item, block, timeout)


def test_a_submit_caught_by_stop_is_answered_or_refused_never_lost() -> None:
    proceed = threading.Event()  # stop() waits for the submit, or the engine thread has already ended
    runner = FakeRunner({1: [EOG]})
    engine = Engine(lambda: runner, n_ctx=256, batch_size=64, parallel=1, cache_slots=0, queue_capacity=8)
    # The window between submit's checks and its put cannot be reached from outside: the engine's lock and inbox are
    # swapped for ones that stop there (the only test that writes the engine's private state).
    engine._lock = _ContendedLock(proceed)
    engine._inbox = inbox = _PausingInbox()
    engine.set_exit_handler(lambda error: proceed.set())
    engine.start()
    assert engine.wait_loaded(TIMEOUT)

    async def main():
        channel = ReplyChannel()
        submitting = asyncio.ensure_future(asyncio.to_thread(engine.submit, request("late", 1), channel))
        assert await asyncio.to_thread(inbox.paused.wait, TIMEOUT)
        stopping = asyncio.ensure_future(asyncio.to_thread(engine.stop, TIMEOUT))
        assert await asyncio.to_thread(proceed.wait, TIMEOUT)
        inbox.resume.set()
        try:
            await submitting
        except EngineUnavailableError:
            return None
        finally:
            assert await stopping
        try:
            return await collect(channel)
        except asyncio.TimeoutError:
            raise AssertionError("the submitted request was never answered (put after the final drain)") from None

    try:
        events = asyncio.run(main())
    finally:
        inbox.resume.set()
        engine.stop(timeout=TIMEOUT)
    if events is not None:  # put before the stop command: answered, whether a step ran before the stop or not
        assert len(events) == 1, events
        assert isinstance(events[0], Finished) or (isinstance(events[0], Failed) and events[0].code == "shutting_down")
    assert runner.closed and engine.stats().waiting == 0


def test_submit_after_the_engine_ended_is_refused(make_engine) -> None:
    runner = FakeRunner({1: [EOG]})
    engine = make_engine(runner)
    assert engine.stop(timeout=TIMEOUT)

    async def main():
        with pytest.raises(EngineUnavailableError):
            submit(engine, request("late", 1))

    asyncio.run(main())
    assert engine.stats().waiting == 0


def test_close_hooks_run_on_the_engine_thread_before_the_model_is_freed(make_engine) -> None:
    runner = FakeRunner({1: [EOG]})
    seen: list[tuple[str, bool]] = []
    engine = make_engine(runner)
    engine.add_close_hook(lambda: seen.append((threading.current_thread().name, runner.closed)))
    engine.add_close_hook(lambda: 1 / 0)  # a failing hook does not keep the model from being freed
    engine.stop(timeout=TIMEOUT)
    assert seen == [("edge-llm-engine", False)]
    assert runner.closed
    engine.add_close_hook(lambda: seen.append((threading.current_thread().name, runner.closed)))
    assert seen[1] == (threading.current_thread().name, True)  # added too late: it runs at once


def test_runner_factory_failure(make_engine) -> None:
    def boom():
        raise RuntimeError("no model")

    engine = Engine(boom, n_ctx=64, batch_size=16, parallel=1, cache_slots=0, queue_capacity=1)
    engine.start()
    assert engine.wait_loaded(TIMEOUT)
    assert engine.stop(timeout=TIMEOUT), "the engine thread did not end"  # it was ending: stop() waits for it
    assert not engine.ready and not engine.alive
    assert isinstance(engine.failure, RuntimeError)
    seen = []
    engine.set_exit_handler(seen.append)  # already ended: called at once
    assert seen == [engine.failure]

    async def main():
        with pytest.raises(EngineUnavailableError):
            submit(engine, request("a", 1))

    asyncio.run(main())


def test_engine_crash_fails_every_request(make_engine) -> None:
    runner = FakeRunner({1: [10] * 10, 2: [20] * 10})
    runner.fail_decode = lambda n: RuntimeError("decode exploded") if n == 3 else None
    engine = make_engine(runner, parallel=1)
    exits = []
    engine.set_exit_handler(exits.append)

    async def main():
        a = submit(engine, request("a", 1))
        b = submit(engine, request("b", 2))
        return await collect(a), await collect(b)

    a, b = asyncio.run(main())
    for events in (a, b):
        assert isinstance(last(events), Failed)
        assert last(events).code == "engine_unavailable"
        assert "stopped unexpectedly" in last(events).message
    assert engine.stop(timeout=TIMEOUT), "the engine thread did not end"  # it was ending: stop() waits for it
    assert isinstance(engine.failure, RuntimeError)
    assert not engine.alive
    assert exits and isinstance(exits[0], RuntimeError)
    assert runner.closed
