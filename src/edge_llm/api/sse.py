"""Server-Sent Events: the server's one framer (`encode_event`, `encode_json_event`, `DONE`), and a streaming
response that notices a client leaving without polling."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)

_LINE_BREAK = re.compile(r"\r\n|\r|\n")

KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: every client ignores it
DEFAULT_KEEPALIVE_INTERVAL = 15.0


def encode_event(data: str, event: str | None = None) -> bytes:
    """One SSE event. Each line of `data` becomes its own `data:` field, so an EventSource client
    rejoins them with "\\n" and gets the text back exactly (a bare "\\r" comes back as "\\n":
    SSE has no way to carry it)."""
    if "\n" in data or "\r" in data:
        body = "\n".join("data: " + line for line in _LINE_BREAK.split(data))
    else:  # one line (every JSON event): the common case, once per streamed token
        body = "data: " + data
    return (f"event: {event}\n{body}\n\n" if event else body + "\n\n").encode("utf-8")


def encode_comment(text: str) -> bytes:
    """An SSE comment line (one line: line breaks in `text` become spaces)."""
    return b": " + " ".join(text.splitlines()).encode("utf-8") + b"\n\n"


def encode_json_event(payload: Mapping[str, Any], event: str | None = None) -> bytes:
    """One SSE event whose data is `payload` as JSON on one line (text beyond ASCII stays UTF-8)."""
    return encode_event(json.dumps(payload, ensure_ascii=False), event)


DONE = encode_event("[DONE]")  # the end of an OpenAI stream


class EventStreamResponse(StreamingResponse):
    """Streams `body` as text/event-stream and cancels it as soon as the client disconnects.

    A listener task waits on `http.disconnect` (an event, not a poll), whatever ASGI spec
    version the server speaks; when it fires, the body iterator is cancelled, its `finally`
    blocks run, and `on_disconnect` (which aborts the engine request) is called.

    While the body has sent nothing for `keepalive_interval` seconds (a request waiting in the queue or
    prefilling a long prompt), a `: keep-alive` comment goes out, so proxies that cut idle connections
    (often after 60 s) keep the stream open. 0 turns it off.

    Another streaming format reuses all of this by subclassing with its own `media_type` (api/ndjson.py).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL,
    ) -> None:
        super().__init__(
            body,
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )
        self.on_disconnect = on_disconnect
        self.keepalive_interval = keepalive_interval
        self._notes: deque[str | bytes] = deque()
        self._notes_waiting: asyncio.Event | None = None

    def note(self, text: str) -> None:
        """Sends `: text` (an SSE comment: clients ignore it, people and proxies see the stream move) in turn with
        the body; dropped before the response starts and after it ends. Event loop only (a plain callback: no task
        of its own, so the response's notes task writes it)."""
        self._aside(text)

    def send_aside(self, chunk: bytes) -> None:
        """Sends an encoded event out of the body's turn, as `note` does (llama-server's `prompt_progress` chunks
        while the prompt is computed, before the body has anything to say)."""
        self._aside(chunk)

    def _aside(self, item: str | bytes) -> None:
        if self._notes_waiting is not None:
            self._notes.append(item)
            self._notes_waiting.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = _Writer(send)
        async with anyio.create_task_group() as group:
            self._notes_waiting = asyncio.Event()

            def client_gone() -> None:
                if self.on_disconnect is not None:
                    self.on_disconnect()
                group.cancel_scope.cancel()

            async def stream() -> None:
                try:
                    await self._stream(writer)
                except OSError:
                    client_gone()
                group.cancel_scope.cancel()

            async def keep_alive() -> None:
                try:
                    await writer.keep_alive(self.keepalive_interval)
                except OSError:
                    client_gone()

            async def listen() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        client_gone()
                        break
                group.cancel_scope.cancel()

            async def notes(waiting: asyncio.Event) -> None:
                while True:
                    await waiting.wait()
                    waiting.clear()
                    while self._notes:
                        item = self._notes.popleft()
                        await writer.aside(item if isinstance(item, bytes) else encode_comment(item))

            group.start_soon(stream)
            group.start_soon(listen)
            group.start_soon(notes, self._notes_waiting)
            if self.keepalive_interval > 0:
                group.start_soon(keep_alive)
        self._notes_waiting = None

    async def _stream(self, writer: _Writer) -> None:
        await writer.start(self.status_code, self.raw_headers)
        try:
            async for chunk in self.body_iterator:
                await writer.write(chunk)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        await writer.end()


class _Writer:
    """The response's one way to `send`: the body and the keep-alive task take turns, and nothing is sent
    before the response starts or after it ends."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = anyio.Lock()
        self._started = anyio.Event()
        self._ended = False
        self._last_sent = anyio.current_time()

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        async with self._lock:
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
            self._last_sent = anyio.current_time()
            self._started.set()

    async def write(self, chunk: bytes) -> None:
        async with self._lock:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
            self._last_sent = anyio.current_time()

    async def end(self) -> None:
        async with self._lock:
            self._ended = True
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def comment(self, text: str) -> None:
        await self.aside(encode_comment(text))

    async def aside(self, chunk: bytes) -> None:
        """`chunk` between the body's chunks; dropped before the response starts and after it ends."""
        async with self._lock:
            if not self._started.is_set() or self._ended:
                return
            try:
                await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError:
                return  # the client is gone: the listener ends the response
            self._last_sent = anyio.current_time()

    async def keep_alive(self, interval: float) -> None:
        """Sends a comment whenever nothing has been sent for `interval` seconds, until the end."""
        await self._started.wait()
        while True:
            await anyio.sleep_until(self._last_sent + interval)
            async with self._lock:
                if self._ended:
                    return
                if anyio.current_time() >= self._last_sent + interval:
                    logger.debug("stream idle for %.1f s: keep-alive", interval)
                    await self._send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                    self._last_sent = anyio.current_time()
