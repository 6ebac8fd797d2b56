"""SSE framing (api/sse.py): encode_event, read back by an independent parser (httpx-sse, as clients read it), and
EventStreamResponse's keep-alive comments."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from edge_llm.api.sse import KEEPALIVE, EventStreamResponse, encode_event
from tests.helpers import parse_sse

ROUND_TRIP = [
    "plain",
    "",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "line1\nline2",
    "\n",
    "\n\n",
    "a\n\nb",
    "\nstarts with newline",
    "ends with newline\n",
    "data: looks like a field",
    "event: fake\ndata: fake",
    ": a comment-looking line",
    "colon:inside",
    "unicode 日本語 😀 é",
    "\u2028 line separator stays",
    '{"json": "payload", "n": [1, 2]}',
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_single_event(text: str) -> None:
    assert parse_sse(encode_event(text).decode("utf-8")) == [("message", text)]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_named_event(text: str) -> None:
    assert parse_sse(encode_event(text, event="delta").decode("utf-8")) == [("delta", text)]


def test_crlf_comes_back_as_lf() -> None:
    assert parse_sse(encode_event("a\r\nb\r\n").decode()) == [("message", "a\nb\n")]


def test_bare_cr_comes_back_as_lf_by_design() -> None:
    # SSE treats "\r" as a line break, so it cannot be carried; the documented behaviour is "\n".
    encoded = encode_event("a\rb\r")
    assert b"\r" not in encoded
    assert parse_sse(encoded.decode()) == [("message", "a\nb\n")]


def test_wire_format_one_data_field_per_line() -> None:
    assert encode_event("x\ny", event="done") == b"event: done\ndata: x\ndata: y\n\n"
    assert encode_event("") == b"data: \n\n"
    assert encode_event("日").decode("utf-8") == "data: 日\n\n"


def test_encoded_event_has_no_blank_line_inside() -> None:
    # an empty line inside the payload must not terminate the event early
    encoded = encode_event("a\n\n\nb").decode()
    assert encoded.endswith("\n\n")
    assert "\n\n" not in encoded[:-2]


def test_stream_of_several_events_keeps_order_and_names() -> None:
    events = [("message", "first"), ("delta", "sec\nond"), ("message", ""), ("done", "[DONE]")]
    stream = "".join(
        encode_event(data, event=None if name == "message" else name).decode() for name, data in events
    )
    assert parse_sse(stream) == events


# ---- keep-alive comments ------------------------------------------------------------------------------


class Client:
    """The ASGI side of one response: records what is sent; `comment` is set at the first keep-alive."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.comment = asyncio.Event()
        self.disconnect = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message.get("body") == KEEPALIVE:
            self.comment.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


async def _serve(response: EventStreamResponse, client: Client) -> None:
    await asyncio.wait_for(response({"type": "http"}, client.receive, client.send), 5)


def test_an_idle_stream_gets_keep_alive_comments_before_its_first_event() -> None:
    async def run() -> Client:
        client = Client()

        async def body() -> AsyncIterator[bytes]:
            await client.comment.wait()  # queued: nothing to send until a keep-alive has gone out
            yield encode_event("first")
            yield encode_event("[DONE]")

        await _serve(EventStreamResponse(body(), keepalive_interval=0.05), client)
        return client

    client = asyncio.run(run())
    start, *bodies, end = client.messages
    assert start["type"] == "http.response.start"
    assert end == {"type": "http.response.body", "body": b"", "more_body": False}  # nothing after the end
    assert bodies[0]["body"] == KEEPALIVE == b": keep-alive\n\n"
    assert all(m["more_body"] for m in bodies)
    text = client.body.decode()
    assert text.endswith("data: first\n\ndata: [DONE]\n\n")
    assert parse_sse(text) == [("message", "first"), ("message", "[DONE]")]  # the comments are ignored


def test_keep_alive_off_sends_only_the_events() -> None:
    async def run() -> Client:
        on, off = Client(), Client()

        async def on_body() -> AsyncIterator[bytes]:
            await on.comment.wait()
            yield encode_event("on")

        async def off_body() -> AsyncIterator[bytes]:
            # idle until a stream with keep-alive on, started beside it, has sent its keep-alive comment
            await on.comment.wait()
            yield encode_event("only")

        await asyncio.gather(_serve(EventStreamResponse(on_body(), keepalive_interval=0.05), on),
                             _serve(EventStreamResponse(off_body(), keepalive_interval=0), off))
        assert on.body.startswith(KEEPALIVE)
        return off

    assert asyncio.run(run()).body == b"data: only\n\n"


def test_a_client_leaving_an_idle_stream_ends_it_and_stops_the_keep_alive() -> None:
    async def run() -> tuple[Client, list[str]]:
        client = Client()
        calls: list[str] = []
        closed = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            try:
                await asyncio.Event().wait()  # never any output
                yield b""
            finally:
                closed.set()

        async def leave() -> None:
            await client.comment.wait()
            client.disconnect.set()

        leaving = asyncio.ensure_future(leave())
        await _serve(EventStreamResponse(body(), keepalive_interval=0.05,
                                         on_disconnect=lambda: calls.append("abort")), client)
        await leaving
        assert closed.is_set()
        return client, calls

    client, calls = asyncio.run(run())
    assert calls == ["abort"]
    assert set(client.body.split(KEEPALIVE)) == {b""}  # only comments were sent
