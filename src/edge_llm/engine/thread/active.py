"""One generation request's state on the engine thread, from submission to its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.thread.channel import Sender
from edge_llm.engine.hooks import EngineObserver
from edge_llm.engine.scheduling.sequence import Phase, Sequence
from edge_llm.engine.thread.text import OutputText
from edge_llm.engine.types import GenerationRequest, TokenLogprob


@dataclass(eq=False)
class ActiveRequest:
    request: GenerationRequest
    channel: Sender
    submitted_at: float
    sequence: Sequence | None = None
    sampler: Any = None
    output: OutputText = field(default_factory=OutputText)
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    deadline: float = float("inf")
    text_parts: list[str] | None = None  # the output, kept only for --log-prompts
    preempted_at: float = 0.0  # when it was last put back in the queue (0: it is not there)
    recompute_s: float = 0.0  # time spent queued again and recomputing after preemptions
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)  # tokens whose text is held back

    def token_arrived(self, now: float, observer: EngineObserver | None) -> None:
        """A token was sampled at `now`: first-token and inter-token times, and the end of a recompute."""
        if not self.first_token_at:
            self.first_token_at = now
            if observer is not None:
                observer.first_token(self.request.request_id, now, now - self.submitted_at)
        elif observer is not None:
            observer.token_gap(now - self.last_token_at)
        self.last_token_at = now
        if self.preempted_at:
            self.recompute_s += now - self.preempted_at
            self.preempted_at = 0.0

    def timings(self, now: float) -> dict[str, float | int]:
        """The answer's `timings` as it ends at `now`: queue, prefill and decode, and what preemptions and
        speculative decoding added."""
        sequence = self.sequence
        assert sequence is not None
        first = self.first_token_at or now
        admitted = self.admitted_at or now
        timings: dict[str, float | int] = {
            "queue_ms": round((admitted - self.submitted_at) * 1000, 2),
            "prefill_ms": round((first - admitted) * 1000, 2),
            "decode_ms": round((now - first) * 1000, 2),
        }
        if sequence.preemptions:
            timings["preemptions"] = sequence.preemptions
            timings["recompute_ms"] = round(self.recompute_s * 1000, 2)
            timings["preempted_after_tokens"] = sequence.generated_at_first_preemption
        if sequence.speculation is not None and sequence.speculation.drafted:  # llama-server's names, as it does
            timings["draft_n"] = sequence.speculation.drafted
            timings["draft_n_accepted"] = sequence.speculation.accepted
        return timings

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The log-probabilities of the tokens behind the text about to be sent."""
        if not self.pending_logprobs:
            return ()
        taken = tuple(self.pending_logprobs)
        self.pending_logprobs.clear()
        return taken


def phase_name(sequence: Sequence | None) -> str:
    """The phase as the metrics name it: queued, prefill or decode."""
    if sequence is None or sequence.phase is Phase.WAITING:
        return "queued"
    return sequence.phase.value
