"""The engine's embedding queue (pure): pooling across chunks, fixed chunk boundaries, cancellation, errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.engine.thread.channel import Outbox, Outgoing, ReplyChannel
from edge_llm.engine.thread.embeddings import EmbeddingQueue
from edge_llm.engine.types import Embedded, EmbeddingRequest, EmbeddingUnavailableError, Failed, Pooling

DIM = 6


class FakeHiddenStates:
    """Each token's hidden state is a fixed function of (token, position), as in a causal model's cache."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, tokens: list[int], start: int) -> np.ndarray:
        self.calls.append((list(tokens), start))
        rows = [np.sin(np.arange(DIM) * (token + 1) + position) for position, token in enumerate(tokens, start)]
        return np.array(rows, dtype=np.float32)

    def whole(self, tokens: list[int]) -> np.ndarray:
        return FakeHiddenStates()(tokens, 0)


def expected(pooling: Pooling, states: np.ndarray) -> np.ndarray:
    vector = {Pooling.MEAN: states.mean(axis=0), Pooling.LAST: states[-1], Pooling.CLS: states[0]}[pooling]
    return vector / np.linalg.norm(vector)


def run_scheduled_callbacks(loop: asyncio.AbstractEventLoop) -> None:
    """Runs the callbacks already scheduled on `loop` (the outbox's deliveries), one iteration, then returns."""
    loop.call_soon(loop.stop)
    loop.run_forever()


class RecordingChannel(ReplyChannel):
    """A reply channel that also keeps what is delivered to it (through `put`, on its event loop), so that a test
    reads it without a consumer task."""

    def __init__(self, choices: int = 1, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(choices, loop=loop)
        self.delivered: list = []

    def put(self, index: int, event: Outgoing) -> None:
        self.delivered.append(event)
        super().put(index, event)


def channel_events(channel: ReplyChannel) -> list:
    """What was delivered to a RecordingChannel since the last call."""
    assert isinstance(channel, RecordingChannel)
    events, channel.delivered = channel.delivered, []
    return events


@settings(max_examples=60, deadline=None)
@given(
    inputs=st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=300), min_size=1, max_size=4),
    pooling=st.sampled_from(list(Pooling)),
    chunk=st.integers(1, 64),
)
def test_pooling_over_chunks_equals_pooling_over_the_whole_input(
        inputs: list[list[int]], pooling: Pooling, chunk: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        channel = RecordingChannel(1, loop=loop)
        queue = EmbeddingQueue(chunk)
        hidden = FakeHiddenStates()
        queue.add(EmbeddingRequest("r", inputs, pooling), channel)
        outbox = Outbox()
        while queue.pending:
            queue.step(hidden, outbox)
        outbox.flush()
        run_scheduled_callbacks(loop)
        (event,) = channel_events(channel)
    finally:
        loop.close()
    assert isinstance(event, Embedded)
    assert event.prompt_tokens == sum(map(len, inputs))
    assert all(len(tokens) <= chunk for tokens, _ in hidden.calls)
    # every input is cut at the same places, whatever else is queued: identical input, identical arithmetic
    starts = [start for _, start in hidden.calls]
    assert all(start % chunk == 0 for start in starts)
    for tokens, vector in zip(inputs, event.vectors, strict=True):
        assert vector.dtype == np.float32
        np.testing.assert_allclose(vector, expected(pooling, hidden.whole(tokens)), rtol=1e-5, atol=1e-6)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_jobs_run_in_order_and_a_cancelled_one_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    try:
        channels = [RecordingChannel(1, loop=loop) for _ in range(3)]
        queue = EmbeddingQueue(8)
        for index, channel in enumerate(channels):
            queue.add(EmbeddingRequest(f"r{index}", [[index + 1] * 20]), channel)
        assert queue.cancel("r1") and not queue.cancel("r1") and not queue.cancel("unknown")
        hidden = FakeHiddenStates()
        outbox = Outbox()
        while queue.pending:
            queue.step(hidden, outbox)
        outbox.flush()
        run_scheduled_callbacks(loop)
        events = [channel_events(channel) for channel in channels]
    finally:
        loop.close()
    assert [tokens[0] for tokens, _ in hidden.calls] == [1, 1, 1, 3, 3, 3]  # r0's three chunks, then r2's
    assert [start for _, start in hidden.calls] == [0, 8, 16, 0, 8, 16]
    assert isinstance(events[0][0], Embedded) and events[1] == [] and isinstance(events[2][0], Embedded)


@pytest.mark.parametrize(("error", "code"), [(EmbeddingUnavailableError("no memory"), "embeddings_unavailable"),
                                             (RuntimeError("llama_decode failed"), "engine_error")])
def test_a_failing_job_fails_alone_and_the_next_one_runs(error: Exception, code: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        first, second = RecordingChannel(1, loop=loop), RecordingChannel(1, loop=loop)
        queue = EmbeddingQueue(8)
        queue.add(EmbeddingRequest("bad", [[1, 2]]), first)
        queue.add(EmbeddingRequest("good", [[3, 4]]), second)
        hidden = FakeHiddenStates()

        def failing_once(tokens: list[int], start: int) -> np.ndarray:
            if tokens[0] == 1:
                raise error
            return hidden(tokens, start)

        outbox = Outbox()
        while queue.pending:
            queue.step(failing_once, outbox)
        queue.add(EmbeddingRequest("late", [[5]]), RecordingChannel(1, loop=loop))
        queue.fail_all(outbox, "the server is shutting down", "shutting_down")
        assert not queue.pending
        outbox.flush()
        run_scheduled_callbacks(loop)
        (failed,), (embedded,) = channel_events(first), channel_events(second)
    finally:
        loop.close()
    assert isinstance(failed, Failed) and failed.code == code
    assert isinstance(embedded, Embedded) and len(embedded.vectors) == 1
