"""One generation request's state on the engine thread, from submission to its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.channel import Sender
from edge_llm.engine.scheduler import Phase, Sequence
from edge_llm.engine.text import OutputText
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
