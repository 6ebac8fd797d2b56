"""SSE framing (api/sse.py): encode_event / decode_events."""

from __future__ import annotations

import pytest

from edge_llm.api.sse import decode_events, encode_event

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
    assert decode_events(encode_event(text).decode("utf-8")) == [("message", text)]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_named_event(text: str) -> None:
    assert decode_events(encode_event(text, event="delta").decode("utf-8")) == [("delta", text)]


def test_crlf_comes_back_as_lf() -> None:
    assert decode_events(encode_event("a\r\nb\r\n").decode()) == [("message", "a\nb\n")]


def test_bare_cr_comes_back_as_lf_by_design() -> None:
    # SSE treats "\r" as a line break, so it cannot be carried; the documented behaviour is "\n".
    encoded = encode_event("a\rb\r")
    assert b"\r" not in encoded
    assert decode_events(encoded.decode()) == [("message", "a\nb\n")]


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
    assert decode_events(stream) == events


def test_decode_like_an_eventsource_client() -> None:
    # (framed with "\n" as our server does; see the report on "\r\n"-framed streams)
    stream = "event: x\ndata:no-space\ndata:  two\nid: 7\n\n: comment only\n\ndata: y\n\n"
    assert decode_events(stream) == [("x", "no-space\n two"), ("message", "y")]
