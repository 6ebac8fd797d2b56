"""The generation requests the engine thread serves, from their admission to their end: each one's sampler and
sequence, its tokens turned into text (stop strings, max_tokens, the end token), and its one `Finished` or `Failed`
on its channel. Engine thread only; `worker.Engine` owns one after the model is loaded."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from edge_llm.engine.hooks import EngineObserver
from edge_llm.engine.prefix_cache.disk import DiskPrefixCache
from edge_llm.engine.scheduling.scheduler import RequestTooLargeError, Scheduler
from edge_llm.engine.speculative.acceptance import verify
from edge_llm.engine.thread.active import ActiveRequest, phase_name
from edge_llm.engine.thread.channel import Outbox
from edge_llm.engine.thread.runner_protocol import Runner
from edge_llm.engine.thread.text import OutputText
from edge_llm.engine.types import (
    Failed,
    Finished,
    FinishReason,
    GrammarTooCostly,
    SamplingExhausted,
    TextDelta,
    TokenLogprob,
    Usage,
)

logger = logging.getLogger(__name__)


class ActiveRequests:
    def __init__(self, *, runner: Runner, scheduler: Scheduler, outbox: Outbox, observer: EngineObserver | None,
                 disk: DiskPrefixCache | None, keep_text: bool, speculative: bool,
                 forget_waiting: Callable[[str], None]) -> None:
        self._runner = runner
        self._scheduler = scheduler
        self._outbox = outbox
        self._observer = observer
        self._disk = disk
        self._keep_text = keep_text
        self._speculative = speculative
        self._forget_waiting = forget_waiting  # it no longer counts against the queue's capacity
        self._active: dict[str, ActiveRequest] = {}  # in submission order

    def __bool__(self) -> bool:
        return bool(self._active)

    def get(self, request_id: str) -> ActiveRequest | None:
        return self._active.get(request_id)

    def admit(self, active: ActiveRequest) -> None:
        request = active.request
        try:
            # A request that cannot be served fails alone; it never takes the engine thread down.
            active.sampler = self._runner.new_sampler(request.sampling)
            active.sequence = self._scheduler.add(request.request_id, request.prompt_tokens, request.max_tokens,
                                                  use_cache=request.cache_prompt, reuse_min=request.reuse_min,
                                                  speculative=self._speculative and request.speculative,
                                                  group=active.channel.route()[0])  # one channel per API request
            if self._disk is not None:
                self._disk.on_submitted(active.sequence)
        except Exception as exc:  # noqa: BLE001
            self._forget_waiting(request.request_id)
            if active.sampler is not None:
                active.sampler.close()
            code = "context_length_exceeded" if isinstance(exc, RequestTooLargeError) else "invalid_request"
            logger.warning("request refused by the engine: %s", exc, extra={"request_id": request.request_id})
            self._outbox.add(active.channel, Failed(str(exc), code=code))
            return
        active.output = OutputText(request.stop)
        if self._keep_text:
            active.text_parts = []
        self._active[request.request_id] = active

    def cancel(self, request_id: str) -> None:
        active = self._active.get(request_id)
        if active is not None:
            logger.debug("request cancelled in phase %s", phase_name(active.sequence),
                         extra={"request_id": request_id})
            self.finish(active, FinishReason.CANCELLED)

    def expire(self, now: float) -> None:
        """Ends requests past their deadline. All share one timeout, so `_active` (in submission
        order) has the earliest deadline first and the check is O(1) while nothing expires."""
        while self._active:
            active = next(iter(self._active.values()))
            if active.deadline > now:
                return
            request_id = active.request.request_id
            self._forget_waiting(request_id)
            logger.info("request timed out after %.1f s in phase %s", now - active.submitted_at,
                        phase_name(active.sequence), extra={"request_id": request_id})
            self.finish(active, FinishReason.TIMEOUT)

    def sample(self, active: ActiveRequest, rows: list[int]) -> None:
        """Samples the sequence's next token from `rows[0]`; with a draft in the batch (`rows[1:]`, speculative
        decoding), the tokens after it too while they confirm the draft (engine/speculative/acceptance.py)."""
        sequence = active.sequence
        draft = sequence.speculation.in_flight if sequence.speculation is not None else ()
        top_n = active.request.logprobs
        logprobs: list[TokenLogprob] = []

        def draw(row: int) -> int:
            token = self._runner.sample(active.sampler, row)
            if top_n is not None:
                logprobs.append(self._runner.logprobs(row, token, top_n))
            return token

        verified = verify(draft, rows, draw, self._runner.is_end_of_generation)
        if draft:
            self._scheduler.settle_draft(sequence, verified.accepted)
        for i, token in enumerate(verified.tokens):
            if i < len(logprobs):
                active.pending_logprobs.append(logprobs[i])
            self._on_token(active, token)
            if self._active.get(active.request.request_id) is not active:
                return  # it ended (an end token, a stop string, max_tokens)
        error = verified.error
        if isinstance(error, GrammarTooCostly):
            self.fail(active, str(error), "grammar_too_costly")
        elif isinstance(error, SamplingExhausted):
            if error.complete:
                self.finish(active, FinishReason.STOP)
            else:
                self.fail(active, f"The answer cannot continue: {error}", "invalid_request")
        elif error is not None:  # one request's sampling error must not take the engine down
            logger.error("sampling failed", exc_info=error, extra={"request_id": active.request.request_id})
            self.fail(active, f"Sampling failed: {error}", "engine_error")

    def _on_token(self, active: ActiveRequest, token: int) -> None:
        sequence = active.sequence
        active.token_arrived(time.monotonic(), self._observer)
        if self._runner.is_end_of_generation(token):
            self.finish(active, FinishReason.STOP)
            return
        self._scheduler.on_sampled(sequence, token)
        text = active.output.feed(self._runner.piece(token))
        if text:
            self._outbox.add(active.channel, TextDelta(text, sequence.generated, active.take_logprobs()))
            if active.text_parts is not None:
                active.text_parts.append(text)
        if active.output.stopped:
            self.finish(active, FinishReason.STOP)
        elif sequence.generated >= sequence.max_tokens:
            self.finish(active, FinishReason.LENGTH)

    def finish(self, active: ActiveRequest, reason: FinishReason) -> None:
        sequence = active.sequence
        phase = phase_name(sequence)
        del self._active[active.request.request_id]
        if self._disk is not None:
            self._disk.on_finished(sequence, reason)  # marked for saving once the engine is idle
        self._scheduler.remove(sequence, keep_in_cache=True)
        if active.sampler is not None:
            active.sampler.close()
        if reason is not FinishReason.CANCELLED:
            tail = active.output.finish()
            if tail:
                self._outbox.add(active.channel, TextDelta(tail, sequence.generated, active.take_logprobs()))
                if active.text_parts is not None:
                    active.text_parts.append(tail)
        timings = active.timings(time.monotonic())
        usage = Usage(len(sequence.prompt), sequence.generated, sequence.cached_tokens)
        if self._observer is not None:  # before Finished, so the HTTP side sees the record complete
            text = "".join(active.text_parts) if active.text_parts is not None else None
            self._observer.request_finished(active.request.request_id, reason, usage, phase, text)
        self._outbox.add(active.channel, Finished(reason, usage, timings, active.output.stop_string))

    def fail(self, active: ActiveRequest, message: str, code: str) -> None:
        """Ends one request with an error (what it streamed so far stays sent)."""
        del self._active[active.request.request_id]
        if self._disk is not None:
            self._disk.forget(active.request.request_id)
        self._scheduler.remove(active.sequence, keep_in_cache=True)
        active.sampler.close()
        logger.warning("request failed: %s", message, extra={"request_id": active.request.request_id})
        if self._observer is not None:
            self._observer.request_failed(active.request.request_id, code)
        self._outbox.add(active.channel, Failed(message, code=code))

    def fail_all(self, never_admitted: Iterable[ActiveRequest], message: str, code: str) -> None:
        """Every request, and those submitted but never seen by the loop, ends with the same error (the engine is
        going away)."""
        failed = [*self._active.values(), *never_admitted]
        self._active.clear()
        for active in failed:
            if self._observer is not None:
                self._observer.request_failed(active.request.request_id, code)
            self._outbox.add(active.channel, Failed(message, code=code))  # after what the last steps produced
            if active.sampler is not None:
                active.sampler.close()
