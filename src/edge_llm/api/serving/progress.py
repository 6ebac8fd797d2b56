"""A long prompt's prefill shown in a stream's own events, where its protocol has one that clients accept.

Clients time a stream out when no event comes (Codex drops a Responses stream after 300 s without one, and SSE
comments do not reset its timer), and a 30k-token prompt can take minutes to prefill on a small machine. So while the
prompt is computed, the Responses stream repeats `response.in_progress` and the Anthropic stream sends `ping`, as
their vendors' servers do: at most one a second (the engine reports once per prefill chunk), never before the
stream's opening events nor once the answer has begun. Streams of the other families show the prefill as SSE comment
lines (`outcome.prefill_note`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from edge_llm.api.sse import EventStreamResponse
from edge_llm.engine.types import PrefillProgress

logger = logging.getLogger(__name__)

MIN_INTERVAL_S = 1.0


class PrefillBeats:
    """The events one stream sends while its prompt is prefilled: `event()` makes one (consuming a sequence number,
    so it is called only when the event goes out; `progress` is then the engine's report it answers).
    `min_interval=0`: one event per report (llama-server's `return_progress`). Event loop only."""

    def __init__(self, event: Callable[[], bytes], min_interval: float = MIN_INTERVAL_S) -> None:
        self._event = event
        self._min_interval = min_interval
        self._armed = False
        self._over = False
        self._last = float("-inf")
        self._response: EventStreamResponse | None = None
        self.progress: PrefillProgress | None = None

    def attach(self, response: EventStreamResponse) -> None:
        self._response = response

    def arm(self) -> None:
        """The stream's opening events are out: beats may follow them."""
        self._armed = True

    def stop(self) -> None:
        """The answer has begun (or ended): no more beats."""
        self._over = True

    def beat(self, progress: PrefillProgress | None = None) -> None:
        """The prefill moved by a chunk (`progress`: the engine's report of it)."""
        if not self._armed or self._over or self._response is None:
            return
        now = time.monotonic()
        if now - self._last < self._min_interval:
            return
        self._last = now
        self.progress = progress
        self._response.send_aside(self._event())
