"""Per-request records for the access log, and the engine observer that feeds them and the metrics.

The request middleware opens a record under the request id; the engine thread (which knows the
request by the same id) fills in tokens, first-token time and finish reason; the middleware writes
the access line when the response is over.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from edge_llm.engine.types import FinishReason, Usage
from edge_llm.api.metrics import Metrics


@dataclass(eq=False)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float  # time.monotonic()
    status: int = 0
    error_code: str | None = None
    first_token_at: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    prompt: Any = None  # only with --log-prompts
    output: str | list[str | None] | None = None  # only with --log-prompts (a list when n > 1)
    idle_timeout: bool = False
    model: str | None = None  # with several models served: the one that served it


class RequestRecords:
    """Records of the requests in flight, by id. Written by the event loop, read by the engine thread."""

    def __init__(self) -> None:
        self._records: dict[str, RequestRecord] = {}

    def open(self, request_id: str, method: str, path: str, started: float) -> RequestRecord:
        """Ids must be unique while in flight (the engine keys requests by them): a client's id that
        is already in use gets a suffix."""
        while request_id in self._records:
            request_id = f"{request_id}-{secrets.token_hex(3)}"
        record = RequestRecord(request_id, method, path, started)
        self._records[request_id] = record
        return record

    def close(self, record: RequestRecord) -> None:
        self._records.pop(record.request_id, None)

    def get(self, request_id: str) -> RequestRecord | None:
        """By the engine's request id: the HTTP request's id, or "<id>/<choice>" when n > 1."""
        record = self._records.get(request_id)
        if record is None and "/" in request_id:
            record = self._records.get(request_id.partition("/")[0])
        return record


class EngineTelemetry:
    """The engine's observer (see `edge_llm.engine.hooks`): metrics plus the access-log record."""

    def __init__(self, metrics: Metrics, records: RequestRecords, model: str = "") -> None:
        self._metrics = metrics
        self._records = records
        self._inter_token = metrics.inter_token
        self._model_generated = metrics.model_generated_tokens.labels(model)
        self._model = model

    def request_admitted(self, request_id: str, queue_wait: float, prompt_tokens: int, cached_tokens: int,
                         moved_tokens: int) -> None:
        metrics = self._metrics
        metrics.queue_wait.observe(queue_wait)
        metrics.prompt_tokens.inc(prompt_tokens)
        if cached_tokens:
            metrics.cached_prompt_tokens.inc(cached_tokens)
        if moved_tokens:
            metrics.moved_prompt_tokens.inc(moved_tokens)

    def first_token(self, request_id: str, at: float, since_submit: float) -> None:
        self._metrics.ttft.observe(since_submit)
        record = self._records.get(request_id)
        if record is not None and not record.first_token_at:  # the first of its choices
            record.first_token_at = at

    def token_gap(self, seconds: float) -> None:
        self._inter_token.observe(seconds)

    def request_finished(
        self, request_id: str, reason: FinishReason, usage: Usage, phase: str, text: str | None
    ) -> None:
        metrics = self._metrics
        if usage.completion_tokens:
            metrics.generated_tokens.inc(usage.completion_tokens)
            self._model_generated.inc(usage.completion_tokens)
        metrics.finished.labels(reason.value).inc()
        metrics.model_finished.labels(self._model, reason.value).inc()
        if reason is FinishReason.CANCELLED:
            metrics.cancellations.labels(phase).inc()
        record = self._records.get(request_id)
        if record is None:
            return
        if record.completion_tokens is None:
            record.prompt_tokens = usage.prompt_tokens
            record.cached_tokens = usage.cached_tokens
            record.completion_tokens = usage.completion_tokens
            record.finish_reason = reason.value
            record.output = text
        else:  # another choice of the same request (n > 1): tokens add up, the prompt counts once
            record.completion_tokens += usage.completion_tokens
            reasons = (record.finish_reason or "").split(",")
            if reason.value not in reasons:
                record.finish_reason = ",".join([*reasons, reason.value])
            if text is not None:
                record.output = [*(record.output if isinstance(record.output, list) else [record.output]), text]

    def request_failed(self, request_id: str, code: str) -> None:
        self._metrics.finished.labels("error").inc()
        self._metrics.model_finished.labels(self._model, "error").inc()
        record = self._records.get(request_id)
        if record is not None:
            record.finish_reason = "error"
            record.error_code = code
