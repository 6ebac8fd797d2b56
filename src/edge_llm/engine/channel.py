"""A request's reply channel: the engine thread sends, one asyncio task receives.

A request with several choices (n > 1, or several prompts) has one channel and one sender per
choice; events come out tagged with the choice's index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edge_llm.engine.types import EngineEvent, Failed, Finished


class ChoiceSender:
    """What the engine holds for one choice: `send` never blocks and is safe from any thread."""

    def __init__(self, channel: ReplyChannel, index: int) -> None:
        self._channel = channel
        self.index = index

    def send(self, event: EngineEvent) -> None:
        self._channel.put(self.index, event)


class ReplyChannel:
    """Unbounded, so a slow client never blocks the engine thread; it is bounded in practice by max_tokens."""

    def __init__(self, choices: int = 1, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, EngineEvent]] = asyncio.Queue()
        self.choices = choices

    def sender(self, index: int) -> ChoiceSender:
        return ChoiceSender(self, index)

    def send(self, event: EngineEvent) -> None:
        """Sends for choice 0 (the single-choice case)."""
        self.put(0, event)

    def put(self, index: int, event: EngineEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, event))
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more

    async def choice_events(self) -> AsyncIterator[tuple[int, EngineEvent]]:
        """(choice index, event) until every choice has ended (Finished or Failed)."""
        open_choices = self.choices
        while open_choices:
            index, event = await self._queue.get()
            if isinstance(event, (Finished, Failed)):
                open_choices -= 1
            yield index, event

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        async for _, event in self.choice_events():
            yield event
