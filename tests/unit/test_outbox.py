"""The engine's Outbox: a step's events reach each event loop in one wake-up, in order, per choice."""

from __future__ import annotations

import asyncio
import threading

from edge_llm.engine.thread.channel import Outbox, Outgoing, ReplyChannel
from edge_llm.engine.types import Finished, FinishReason, TextDelta, Usage


def test_a_steps_events_arrive_in_order_with_one_wake_up() -> None:
    async def scenario() -> tuple[list, list, int]:
        loop = asyncio.get_running_loop()
        wake_ups = 0
        original = loop.call_soon_threadsafe

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal wake_ups
            wake_ups += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        single, double = ReplyChannel(), ReplyChannel(choices=2)
        outbox = Outbox()
        done = Finished(FinishReason.STOP, Usage(3, 2), {})

        def engine_step() -> None:  # the engine thread
            outbox.add(single, TextDelta("a", 1))
            outbox.add(double.sender(1), TextDelta("x", 1))
            outbox.add(single, TextDelta("b", 2))
            outbox.add(double.sender(0), done)
            outbox.add(double.sender(1), done)
            outbox.add(single, done)
            outbox.flush()
            outbox.flush()  # nothing left: no second wake-up

        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        first = [event async for event in single]
        second = [pair async for pair in double.choice_events()]
        return first, second, wake_ups

    first, second, wake_ups = asyncio.run(scenario())
    assert [getattr(e, "text", "end") for e in first] == ["a", "b", "end"]
    assert [(i, getattr(e, "text", "end")) for i, e in second] == [(1, "x"), (0, "end"), (1, "end")]
    assert wake_ups == 1


def test_a_closed_event_loop_is_skipped_quietly() -> None:
    loop = asyncio.new_event_loop()
    delivered: list[Outgoing] = []

    class Recording(ReplyChannel):
        def put(self, index: int, event: Outgoing) -> None:
            delivered.append(event)

    channel = Recording(loop=loop)
    loop.close()  # the client's side is gone
    outbox = Outbox()
    outbox.add(channel, TextDelta("a", 1))
    outbox.flush()  # no error reaches the engine thread
    assert delivered == []
