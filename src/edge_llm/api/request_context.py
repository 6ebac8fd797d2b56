"""One request's facts, in one object: made by the request middleware (api/middleware.py), kept in the request's
ASGI scope, and handed explicitly to the serving code (`request_context(request)` in a handler, then as an
argument).

It holds the request's record (id, method, path, start, model, status, error code, tokens: what the access line
and the metrics report, api/telemetry.py), its JSON body parsed once (api/serving/body.py), the body's size (a large
one's tokenizer work goes to the bulk thread), the unknown keys ignored in it (the X-Edge-LLM-Ignored-Fields header,
api/params.py) and how long it waited for its model to load (`timings.load_ms`, api/model_routing.py). Log lines
name its id and model through logs.bind_subject (the one ContextVar, for log records only: see logs.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import HTTPConnection

from edge_llm.api.telemetry import RequestRecord

# The scope key under which the middleware keeps a request's context.
CONTEXT_KEY = "edge_llm.request"


@dataclass(eq=False)
class RequestContext:
    record: RequestRecord
    body: dict[str, Any] | None = None  # the JSON body, once parsed (body.request_json)
    body_bytes: int = 0  # the body's size, once read
    ignored_fields: list[str] = field(default_factory=list)  # dotted paths, each once, in order
    load_wait_ms: float = 0.0  # how long the request waited for its model to load

    @property
    def id(self) -> str:
        return self.record.request_id

    @property
    def model(self) -> str | None:
        """The model that serves the request, set only when the server serves several (with one, every line would
        name the same model)."""
        return self.record.model

    @model.setter
    def model(self, name: str) -> None:
        self.record.model = name

    @property
    def started(self) -> float:
        """When the request arrived (time.monotonic())."""
        return self.record.started

    def note_error(self, code: str | None) -> None:
        """The code of the error the request is answered with; an engine failure's code, noted first, stays."""
        if code and self.record.error_code is None:
            self.record.error_code = code


def request_context(request: HTTPConnection) -> RequestContext:
    """The context the middleware made for this request."""
    context: RequestContext = request.scope[CONTEXT_KEY]
    return context


def scope_context(scope: Mapping[str, Any]) -> RequestContext | None:
    """The context of the request of this ASGI scope (None outside HTTP requests)."""
    return scope.get(CONTEXT_KEY)
