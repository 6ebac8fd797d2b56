"""PrefillBeats: a stream's own events while its prompt is prefilled (api/serving/progress.py)."""

from __future__ import annotations

from typing import cast

from edge_llm.api.serving.progress import PrefillBeats
from edge_llm.api.sse import EventStreamResponse


class Wire:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_aside(self, chunk: bytes) -> None:
        self.sent.append(chunk)


def beats_on(wire: Wire, min_interval: float) -> tuple[PrefillBeats, list[int]]:
    made: list[int] = []

    def event() -> bytes:
        made.append(len(made))
        return f"beat {len(made)}".encode()

    beats = PrefillBeats(event, min_interval=min_interval)
    beats.attach(cast(EventStreamResponse, wire))
    return beats, made


def test_nothing_before_the_opening_events_nor_after_the_answer_begins() -> None:
    wire = Wire()
    beats, made = beats_on(wire, min_interval=0)
    beats.beat()
    assert wire.sent == [] and made == []  # no sequence number consumed by a beat that does not go out
    beats.arm()
    beats.beat()
    beats.beat()
    beats.stop()
    beats.beat()
    assert wire.sent == [b"beat 1", b"beat 2"]


def test_at_most_one_beat_per_interval() -> None:
    wire = Wire()
    beats, made = beats_on(wire, min_interval=3600)
    beats.arm()
    for _ in range(5):
        beats.beat()
    assert wire.sent == [b"beat 1"] and made == [0]
