"""What the engine thread reports about each request, for metrics and the access log.

Every method runs on the engine thread, inside the step loop: implementations must be quick,
must not block and must not raise.
"""

from __future__ import annotations

from typing import Protocol

from edge_llm.engine.types import FinishReason, Usage


class EngineObserver(Protocol):
    def request_admitted(self, request_id: str, queue_wait: float, prompt_tokens: int, cached_tokens: int,
                         moved_tokens: int) -> None:
        """A waiting request got a sequence after `queue_wait` seconds in the queue; `moved_tokens` of its
        `cached_tokens` were moved to new positions (--cache-reuse)."""

    def first_token(self, request_id: str, at: float, since_submit: float) -> None:
        """The first token was sampled at monotonic time `at`, `since_submit` seconds after submission."""

    def token_gap(self, seconds: float) -> None:
        """Seconds between two consecutive tokens of one sequence."""

    def request_finished(
        self, request_id: str, reason: FinishReason, usage: Usage, phase: str, text: str | None
    ) -> None:
        """The request ended (stop, length, timeout or cancelled in `phase`: queued, prefill or decode).
        `text` is its output when the engine keeps it (`keep_text`), else None."""

    def request_failed(self, request_id: str, code: str) -> None:
        """The request ended with an error (the engine stopped or died)."""
