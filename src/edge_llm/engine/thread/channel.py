"""A request's reply channel: the engine thread sends, one asyncio task receives.

A request with several choices (n > 1, or several prompts) has one channel and one sender per
choice; events come out tagged with the choice's index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from edge_llm.engine.types import Embedded, EngineEvent, Failed, Finished, PrefillProgress

Outgoing = EngineEvent | PrefillProgress


class ChoiceSender:
    """What the engine holds for one choice; its events reach the channel through the engine's `Outbox`."""

    def __init__(self, channel: ReplyChannel, index: int) -> None:
        self._channel = channel
        self.index = index

    def route(self) -> tuple[ReplyChannel, int]:
        return self._channel, self.index


class ReplyChannel:
    """Unbounded, so a slow client never blocks the engine thread; it is bounded in practice by max_tokens."""

    def __init__(self, choices: int = 1, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, EngineEvent]] = asyncio.Queue()
        self.choices = choices
        # Added to each Finished's timings on the way out: what the engine does not see (the model's load).
        self.extra_timings: dict[str, float] = {}
        # Who shows a long prefill moving (a stream's comment lines); progress is dropped when nobody does.
        self.on_progress: Callable[[int, PrefillProgress], None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop that reads this channel: events are handed to it (see `Outbox`)."""
        return self._loop

    def put(self, index: int, event: Outgoing) -> None:
        """Queues choice `index`'s event. Event loop only (the `Outbox` calls it there)."""
        if isinstance(event, PrefillProgress):
            if self.on_progress is not None:
                self.on_progress(index, event)
            return
        self._queue.put_nowait((index, event))

    def sender(self, index: int) -> ChoiceSender:
        return ChoiceSender(self, index)

    def route(self) -> tuple[ReplyChannel, int]:
        """A single-choice channel is its own sender, for choice 0."""
        return self, 0

    async def choice_events(self) -> AsyncIterator[tuple[int, EngineEvent]]:
        """(choice index, event) until every choice has ended (Finished, Failed, or Embedded)."""
        open_choices = self.choices
        while open_choices:
            index, event = await self._queue.get()
            if isinstance(event, (Finished, Failed, Embedded)):
                open_choices -= 1
                if isinstance(event, Finished) and self.extra_timings:
                    event.timings.update(self.extra_timings)
            yield index, event

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        async for _, event in self.choice_events():
            yield event


class Sender(Protocol):
    """A choice's destination: its channel and the choice's index there."""

    def route(self) -> tuple[ReplyChannel, int]: ...


class Outbox:
    """What the engine thread sends during one step, handed to each event loop in one wake-up.

    One `call_soon_threadsafe` per event would wake the event loop once per token, and each time
    the engine thread would wait for the GIL while the loop turns that token into SSE; handed over
    together, the loop does that work while the next `llama_decode` runs (which releases the GIL).
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Sender, Outgoing]] = []

    def add(self, sender: Sender, event: Outgoing) -> None:
        self._pending.append((sender, event))

    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[ReplyChannel, int, Outgoing]]] = {}
        for sender, event in pending:
            channel, index = sender.route()
            by_loop.setdefault(channel.loop, []).append((channel, index, event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                pass  # the event loop is closed: nobody is listening any more


def _deliver(items: list[tuple[ReplyChannel, int, Outgoing]]) -> None:
    for channel, index, event in items:
        channel.put(index, event)
