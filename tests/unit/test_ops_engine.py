"""The engine's operations hooks with a fake runner: deadlines, the observer, the kill hook, stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from edge_llm.api.app import create_app
from edge_llm.config import Settings
from edge_llm.engine.thread.channel import ReplyChannel
from edge_llm.engine import facade
from edge_llm.engine.facade import EngineClient
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.types import (
    EngineEvent,
    EngineStats,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    Usage,
)
from edge_llm.engine.thread import worker
from edge_llm.engine.thread.worker import Engine


class _Sampler:
    def close(self) -> None:
        pass


class LlamaFailure(RuntimeError):
    """A failure inside llama.cpp, which the engine thread does not survive."""


class SteppingClock:
    """The engine thread's clock for a deadline test: time moves only when the fake model takes a step, so a deadline
    falls after a known number of steps however fast or busy the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class SlowRunner:
    """A fake model: every sample is token 1 ("a"); nothing ever ends by itself. A decode takes no real time. With
    `gated`, every decode first waits for a step the test allows (`allow(n)`, or `open()` for all the rest), so a
    generation is exactly as far along as the test let it be however fast or busy the machine: what a test puts in
    the engine's inbox (an abort, a stop) before it lets the next step go is handled at that step's end. Once
    `broken` is set, its next decode fails as llama.cpp would (the engine thread dies). With a `clock`, a decode
    moves that clock by `step`."""

    def __init__(self, step: float = 0.01, clock: SteppingClock | None = None, *, gated: bool = False) -> None:
        self.step = step
        self.clock = clock
        self.broken = threading.Event()
        self.decodes = 0
        self._steps = threading.Condition()
        self._allowed: float = 0 if gated else float("inf")

    def allow(self, steps: int = 1) -> None:
        with self._steps:
            self._allowed += steps
            self._steps.notify_all()

    def allow_next(self) -> None:
        """Lets one step go unless one may already: steps at most as fast as the caller."""
        with self._steps:
            self._allowed = max(self._allowed, 1)
            self._steps.notify_all()

    def open(self) -> None:
        self.allow(float("inf"))  # type: ignore[arg-type]

    def decode(self, plan: StepPlan) -> None:
        with self._steps:
            self._steps.wait_for(lambda: self._allowed > 0)
            self._allowed -= 1
            self.decodes += 1
        if self.broken.is_set():
            raise LlamaFailure("llama_decode failed")
        if self.clock is not None:
            self.clock.now += self.step

    def arm_abort(self) -> None:  # a cancelled step runs to its end
        pass

    def abort_step(self) -> None:
        pass

    def new_sampler(self, params: SamplingParams) -> _Sampler:
        return _Sampler()

    def sample(self, sampler: Any, batch_index: int) -> int:
        return 1

    def piece(self, token: int) -> bytes:
        return b"a"

    def is_end_of_generation(self, token: int) -> bool:
        return False

    def apply_kv_ops(self, ops: Any) -> None:
        pass

    def close(self) -> None:
        pass


class Recorder:
    """An EngineObserver that writes everything down (on the engine thread)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def _add(self, name: str, *args: Any) -> None:
        with self.lock:
            self.calls.append((name, args))

    def request_admitted(self, request_id: str, queue_wait: float, prompt_tokens: int, cached_tokens: int,
                         moved_tokens: int) -> None:
        self._add("admitted", request_id, prompt_tokens, cached_tokens)

    def first_token(self, request_id: str, at: float, since_submit: float) -> None:
        self._add("first_token", request_id)

    def token_gap(self, seconds: float) -> None:
        self._add("gap", seconds)

    def request_finished(self, request_id: str, reason: FinishReason, usage: Usage, phase: str,
                         text: str | None) -> None:
        self._add("finished", request_id, reason, usage.completion_tokens, phase, text)

    def request_failed(self, request_id: str, code: str) -> None:
        self._add("failed", request_id, code)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [args for call, args in self.calls if call == name]


def make_engine(*, request_timeout: float | None = None, parallel: int = 2, keep_text: bool = False,
                cache_slots: int = 0, runner: SlowRunner | None = None) -> tuple[Engine, Recorder]:
    recorder = Recorder()
    runner = runner or SlowRunner()
    engine = Engine(lambda: runner, n_ctx=4096, batch_size=64, parallel=parallel, cache_slots=cache_slots,
                    queue_capacity=8, request_timeout=request_timeout, observer=recorder, keep_text=keep_text)
    engine.start()
    assert engine.wait_loaded(5)
    return engine, recorder


def request(request_id: str, max_tokens: int = 3000) -> GenerationRequest:
    return GenerationRequest(request_id, [5, 6, 7], max_tokens)


async def first_event(channel: ReplyChannel) -> EngineEvent:
    async def read() -> EngineEvent:
        async for event in channel:
            return event
        raise AssertionError("no event")

    return await asyncio.wait_for(read(), 5)


async def collect(channel: ReplyChannel, limit: float = 10) -> list[EngineEvent]:
    events: list[EngineEvent] = []

    async def read() -> None:
        async for event in channel:
            events.append(event)

    await asyncio.wait_for(read(), limit)
    return events


def test_a_request_past_its_deadline_ends_with_timeout_and_keeps_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppingClock()
    monkeypatch.setattr(worker, "time", clock)  # the engine thread's deadlines read this clock
    engine, recorder = make_engine(request_timeout=0.3, keep_text=True, runner=SlowRunner(0.01, clock))

    async def run() -> list[EngineEvent]:
        channel = ReplyChannel()
        engine.submit(request("late"), channel)
        return await collect(channel)

    try:
        events = asyncio.run(run())
    finally:
        engine.stop()
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason is FinishReason.TIMEOUT
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    # 0.3 s of 0.01 s steps: the prefill's token and one a step until the deadline (give or take float rounding)
    assert 29 <= len(text) <= 32 and finished.usage.completion_tokens == len(text)
    assert recorder.named("admitted") == [("late", 3, 0)]
    assert recorder.named("first_token") == [("late",)]
    assert len(recorder.named("gap")) == finished.usage.completion_tokens - 1
    assert recorder.named("finished") == [("late", FinishReason.TIMEOUT, len(text), "decode", text)]


def test_without_a_timeout_nothing_expires() -> None:
    engine, recorder = make_engine()

    async def run() -> list[EngineEvent]:
        channel = ReplyChannel()
        engine.submit(request("bounded", max_tokens=20), channel)
        return await collect(channel)

    try:
        events = asyncio.run(run())
    finally:
        engine.stop()
    assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.LENGTH
    assert recorder.named("finished")[0][4] is None  # keep_text is off: no output kept


def test_cancellations_report_their_phase() -> None:
    runner = SlowRunner(gated=True)
    engine, recorder = make_engine(parallel=1, runner=runner)

    async def run() -> None:
        running, waiting = ReplyChannel(), ReplyChannel()
        engine.submit(request("running"), running)
        runner.allow(1)  # the prefill: its token
        assert isinstance(await first_event(running), TextDelta)
        engine.submit(request("waiting"), waiting)  # "running" holds the only sequence: this one waits
        engine.abort("waiting")
        runner.allow(1)
        assert isinstance((await collect(waiting))[-1], Finished)
        engine.abort("running")
        runner.open()  # the abort is in the inbox before the next step ends: it ends "running" there
        assert (await collect(running))[-1].reason is FinishReason.CANCELLED

    try:
        asyncio.run(run())
    finally:
        runner.open()
        engine.stop()
    phases = {args[0]: (args[1], args[3]) for args in recorder.named("finished")}
    assert phases == {"waiting": (FinishReason.CANCELLED, "queued"), "running": (FinishReason.CANCELLED, "decode")}


def test_an_engine_death_fails_requests_and_reports_the_error() -> None:
    runner = SlowRunner(gated=True)
    engine, recorder = make_engine(runner=runner)
    exited: list[BaseException | None] = []
    engine.set_exit_handler(exited.append)

    async def run() -> list[EngineEvent]:
        channel = ReplyChannel()
        engine.submit(request("victim"), channel)
        runner.allow(1)
        assert isinstance(await first_event(channel), TextDelta)
        runner.broken.set()  # before the next step is let go: that step fails, with "victim" still running
        runner.open()
        return await collect(channel)

    events = asyncio.run(run())
    engine.stop()
    assert isinstance(events[-1], Failed) and events[-1].code == "engine_unavailable"
    assert recorder.named("failed") == [("victim", "engine_unavailable")]
    assert not engine.alive and not engine.ready
    assert len(exited) == 1 and isinstance(exited[0], LlamaFailure)


def test_stop_fails_what_is_left_as_shutting_down() -> None:
    runner = SlowRunner(gated=True)
    engine, recorder = make_engine(runner=runner)

    async def run() -> tuple[bool, bool, list[EngineEvent]]:
        channel = ReplyChannel()
        engine.submit(request("left"), channel)
        runner.allow(1)
        assert isinstance(await first_event(channel), TextDelta)
        # The next step is held: a stop that does not wait says the thread is still in it...
        in_step = await asyncio.to_thread(engine.stop, 0)
        runner.open()  # ...and ends it once that step has: "left" is failed there, not run to its end
        stopped = await asyncio.to_thread(engine.stop, 10)
        return in_step, stopped, await collect(channel)

    in_step, stopped, events = asyncio.run(run())
    assert not in_step and stopped
    assert isinstance(events[-1], Failed) and events[-1].code == "shutting_down"
    assert engine.failure is None


def test_stats_is_safe_to_read_while_prefix_cache_entries_are_added_and_evicted() -> None:
    # Two cache slots and prompts that differ in their last token: every request that ends puts its sequence in
    # the prefix cache and, from the third on, evicts the oldest entry, while another thread reads stats().
    # Each step waits for a snapshot taken after the last one ended: reads fall in every gap between steps, while
    # the engine thread changes the cache there.
    runner = SlowRunner(gated=True)
    engine, recorder = make_engine(cache_slots=2, runner=runner)
    snapshots: list[EngineStats] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            snapshots.append(engine.stats())
            runner.allow_next()

    async def run() -> None:
        for wave in range(6):
            channels = [ReplyChannel() for _ in range(6)]
            for i, channel in enumerate(channels):
                engine.submit(GenerationRequest(f"r{wave}-{i}", [5, 6, 7, 100 + 6 * wave + i], 3), channel)
            for channel in channels:
                assert isinstance((await collect(channel))[-1], Finished)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        asyncio.run(run())
    finally:
        done.set()
        reader.join(5)
        runner.open()
        engine.stop()
    assert len(recorder.named("finished")) == 36  # 36 entries into 2 cache slots: 34 evictions or more while reading
    assert len(snapshots) >= runner.decodes > 36
    assert max(stats.cached_sequences for stats in snapshots) == 2
    for stats in snapshots:
        assert stats.kv_cells_total == 4096 and 0 <= stats.cached_sequences <= 2
        assert 0 <= stats.kv_cells_used <= 4096, stats
        assert set(stats.evictions) == {"cache_slots", "kv_cells", "covered", "cleared", "moved_chunk"}
    totals = [sum(stats.evictions.values()) for stats in snapshots]
    assert totals == sorted(totals), "eviction counters only grow"
    assert sum(engine.stats().evictions.values()) >= 34


# ---- the tokenizer thread and the end of the model ---------------------------------------------------


class TokenizingRunner(SlowRunner):
    """A tokenize that stays inside the vocabulary until someone waits for the tokenizer thread (or the model
    is freed); a close that notes whether a tokenize was still running on what it frees."""

    def __init__(self, waited_for: threading.Event) -> None:
        super().__init__()
        self.waited_for = waited_for
        self.inside = threading.Event()
        self.tokenizing = False
        self.closed_while_tokenizing: bool | None = None
        self.close_thread: str | None = None

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.tokenizing = True
        self.inside.set()
        try:
            assert self.waited_for.wait(5), "nobody waited for the tokenizer thread"
            return [1, 2, 3]
        finally:
            self.tokenizing = False

    def close(self) -> None:
        self.closed_while_tokenizing = self.tokenizing
        self.close_thread = threading.current_thread().name
        self.waited_for.set()  # a close that did not wait must not hang the test: it fails it


class WatchedPool(ThreadPoolExecutor):
    """The tokenizer pool, telling when a shutdown starts waiting for its thread."""

    def __init__(self, waited_for: threading.Event, **options: Any) -> None:
        super().__init__(**options)
        self.waited_for = waited_for

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if wait:
            self.waited_for.set()
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


def watch_the_tokenizer_pool(monkeypatch: pytest.MonkeyPatch, waited_for: threading.Event) -> None:
    """The facade's tokenizer thread pool, made from now on, is a WatchedPool (the others stay as they are)."""
    def pool(**options: Any) -> ThreadPoolExecutor:
        if options.get("thread_name_prefix") == "edge-llm-tokenizer":
            return WatchedPool(waited_for, **options)
        return ThreadPoolExecutor(**options)

    monkeypatch.setattr(facade, "ThreadPoolExecutor", pool)


def _app_with(runner: SlowRunner, close_hooks: list[Callable[[], None]] | None = None) -> tuple[Any, Engine]:
    """The app over an engine of `runner`; `close_hooks` gets every hook added to the engine's close (the facade's
    closing of its tokenizer thread)."""
    engine = Engine(lambda: runner, n_ctx=4096, batch_size=64, parallel=2, cache_slots=0, queue_capacity=8)
    if close_hooks is not None:
        add = engine.add_close_hook

        def add_and_keep(hook: Callable[[], None]) -> None:
            close_hooks.append(hook)
            add(hook)

        engine.add_close_hook = add_and_keep  # type: ignore[method-assign]
    app = create_app(Settings(), EngineClient(engine), on_fatal=lambda: None)
    return app, engine


@pytest.mark.parametrize("ending", ["app shutdown", "engine stop (the drain)", "engine death"])
def test_the_model_is_freed_only_after_the_tokenizer_thread_is_done(ending: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    waited_for = threading.Event()
    runner = TokenizingRunner(waited_for)
    watch_the_tokenizer_pool(monkeypatch, waited_for)
    app, engine = _app_with(runner)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            async with app.router.lifespan_context(app):
                assert await asyncio.to_thread(engine.wait_loaded, 5)
                call = asyncio.ensure_future(client.post("/tokenize", json={"content": "hello"}))
                assert await asyncio.to_thread(runner.inside.wait, 5)  # inside llama_tokenize
                if ending == "engine death":  # the next decode fails: a request's
                    runner.broken.set()
                    engine.submit(request("the last"), ReplyChannel())
                if ending != "app shutdown":
                    assert await asyncio.to_thread(engine.stop, 5)
            # "app shutdown": leaving the lifespan stops everything
            return await asyncio.wait_for(call, 5)

    response = asyncio.run(run())
    assert response.status_code == 200 and response.json()["tokens"] == [1, 2, 3]  # the running tokenize finished
    assert runner.closed_while_tokenizing is False
    assert runner.close_thread == "edge-llm-engine"


def test_tokenizer_work_after_the_pool_closed_gets_503() -> None:
    runner = TokenizingRunner(threading.Event())
    close_hooks: list[Callable[[], None]] = []
    app, engine = _app_with(runner, close_hooks)

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            async with app.router.lifespan_context(app):
                assert await asyncio.to_thread(engine.wait_loaded, 5)
                (close_tokenizer,) = close_hooks  # as EngineClient.close does first; the engine still runs
                close_tokenizer()
                return await client.post("/tokenize", json={"content": "hello"})

    response = asyncio.run(run())
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_unavailable"
    assert not runner.inside.is_set()
