"""Server-Sent Events: framing, and a streaming response that notices a client leaving without polling."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def encode_event(data: str, event: str | None = None) -> bytes:
    """One SSE event. Each line of `data` becomes its own `data:` field, so an EventSource client
    rejoins them with "\\n" and gets the text back exactly (a bare "\\r" comes back as "\\n":
    SSE has no way to carry it)."""
    lines = [f"event: {event}"] if event else []
    lines.extend("data: " + line for line in _LINE_BREAK.split(data))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


def decode_events(stream: str) -> list[tuple[str, str]]:
    """The inverse, as an EventSource client does it: (event name, data) pairs."""
    events: list[tuple[str, str]] = []
    for block in re.split(r"(?:\r\n|\r(?!\n)|\n){2}", stream):
        if not block:
            continue
        name, data = "message", []
        for line in _LINE_BREAK.split(block):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events


class EventStreamResponse(StreamingResponse):
    """Streams `body` as text/event-stream and cancels it as soon as the client disconnects.

    A listener task waits on `http.disconnect` (an event, not a poll), whatever ASGI spec
    version the server speaks; when it fires, the body iterator is cancelled, its `finally`
    blocks run, and `on_disconnect` (which aborts the engine request) is called.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def stream() -> None:
                try:
                    await self._stream(send)
                except OSError:
                    if self.on_disconnect is not None:
                        self.on_disconnect()
                group.cancel_scope.cancel()

            async def listen() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        if self.on_disconnect is not None:
                            self.on_disconnect()
                        break
                group.cancel_scope.cancel()

            group.start_soon(stream)
            group.start_soon(listen)

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
