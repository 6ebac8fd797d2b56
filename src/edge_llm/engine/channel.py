"""A request's reply channel: the engine thread sends, one asyncio task receives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from edge_llm.engine.types import EngineEvent, Failed, Finished


class ReplyChannel:
    """Unbounded, so a slow client never blocks the engine thread; it is bounded in practice by max_tokens."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def send(self, event: EngineEvent) -> None:
        """Called from the engine thread; wakes the event loop without blocking."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:
            pass  # the event loop is closed: nobody is listening any more

    async def receive(self) -> EngineEvent:
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, (Finished, Failed)):
                return
