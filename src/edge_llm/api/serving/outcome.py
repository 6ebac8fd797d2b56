"""What one request's work in the engine is (`Generation`, a collected `ChoiceResult`) and how its outcome goes on
the wire in the OpenAI shapes: usage, merged timings, the prefill note, and failures as API errors."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_llm.api.errors import APIError, invalid_request
from edge_llm.api.protocol.errors import OpenAIErrorBody
from edge_llm.api.protocol.openai_answers import PromptTokensDetails, UsageInfo
from edge_llm.engine.facade import ReplyChannel
from edge_llm.engine.types import (
    EngineUnavailableError,
    Failed,
    Finished,
    GenerationRequest,
    PrefillProgress,
    TokenLogprob,
    Usage,
)


@dataclass
class ChoiceResult:
    """One choice of a non-streamed answer, collected."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


@dataclass
class Generation:
    """One HTTP request's work in the engine: a GenerationRequest per choice, one reply channel."""

    requests: list[GenerationRequest]
    channel: ReplyChannel
    prompt_lengths: list[int]  # per distinct prompt
    prompt_of_choice: list[int]  # choice index → prompt index
    model: str = ""  # the name its answers carry (Serving.answer_model)

    @property
    def request_id(self) -> str:
        return self.requests[0].request_id.split("/")[0]

    @property
    def wants_logprobs(self) -> bool:
        return self.requests[0].logprobs is not None


def prefill_note(index: int, progress: PrefillProgress) -> str:
    """The comment line a stream shows while a long prompt is prefilled (docs/operations.md, Limits)."""
    choice = f" (choice {index})" if index else ""
    return f"prefill {progress.processed}/{progress.total} tokens, {progress.cached} cached{choice}"


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def total_usage(generation: Generation, finished: list[Finished | None]) -> Usage:
    """Each distinct prompt counts once, however many choices it had."""
    first_choice_of_prompt: dict[int, Finished] = {}
    for choice, done in enumerate(finished):
        if done is not None:
            first_choice_of_prompt.setdefault(generation.prompt_of_choice[choice], done)
    return Usage(
        prompt_tokens=sum(generation.prompt_lengths),
        completion_tokens=sum(done.usage.completion_tokens for done in finished if done is not None),
        cached_tokens=sum(done.usage.cached_tokens for done in first_choice_of_prompt.values()),
    )


def merged_timings(finished: list[Finished | None]) -> dict[str, float]:
    done = [f for f in finished if f is not None]
    if not done:
        return {}
    return {key: max(f.timings.get(key, 0.0) for f in done) for key in done[0].timings}


def failure_error(failed: Failed) -> APIError:
    if failed.code == "context_length_exceeded":
        return invalid_request(failed.message, param="messages", code=failed.code)
    if failed.code in ("invalid_request", "grammar_too_costly"):  # the request's own grammar or logit_bias
        return invalid_request(failed.message, code=failed.code)
    return APIError(503, failed.message, code=failed.code)


def error_body(failed: Failed) -> OpenAIErrorBody:
    """The error envelope of a request that failed after its answer began (an SSE error event)."""
    return failure_error(failed).openai_body()


def engine_unavailable(exc: EngineUnavailableError) -> APIError:
    """503 for vocabulary work while the model is not loaded or the engine is stopping."""
    return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": "2"})
