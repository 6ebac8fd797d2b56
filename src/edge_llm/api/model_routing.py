"""A request's model: the body's `model` (and Ollama's `keep_alive`) pick the engine that serves it.

The route hands its endpoint family and handler to `with_model`: the body is parsed once (kept in the request's
context, where the family's serving object finds it), the registry gives a lease on the model
(loading it first when needed: `timings.load_ms` says how long the request waited), the family's serving object
for that model's engine handles the request, and the lease is released when the response has been sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from edge_llm.api.errors import APIError
from edge_llm.api.serving import Serving, build_serving
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.body import request_json
from edge_llm.config import Settings
from edge_llm.registry.keep_alive import parse_keep_alive
from edge_llm.registry.registry import (
    DEFAULT_KEEP_ALIVE,
    Lease,
    ModelEntry,
    ModelRegistry,
    ModelUnavailableError,
    UnknownModelError,
)

logger = logging.getLogger(__name__)

Family = TypeVar("Family", bound=Serving)


async def with_model(request: Request, family: type[Family],
                     handler: Callable[[Family], Awaitable[Response]]) -> Response:
    app_state = request.app.state
    registry = cast(ModelRegistry, app_state.registry)
    name, keep_alive = await requested_model(request)
    lease = await acquire(registry, name, keep_alive)
    context = request_context(request)
    if registry.on_demand:  # the log lines and the access line name the model
        context.model = lease.entry.name
    context.load_wait_ms = lease.load_ms
    try:
        serving = serving_for(app_state.settings, lease.entry)[family]
        response = await handler(cast(Family, serving))
    except BaseException:
        lease.release()
        raise
    return LeasedResponse(response, lease)


async def requested_model(request: Request) -> tuple[str | None, Any]:
    """The body's `model` (None when absent or not a string: the default model) and `keep_alive`. A body that is
    not a JSON object names no model; its family's serving object then refuses it."""
    try:
        body = await request_json(request)
    except APIError:  # the family's serving object refuses the body with the same 400
        return None, DEFAULT_KEEP_ALIVE
    model = body.get("model")
    return (model if isinstance(model, str) and model else None), keep_alive_of(body)


def keep_alive_of(body: dict[str, Any]) -> Any:
    if body.get("keep_alive") is None:
        return DEFAULT_KEEP_ALIVE
    try:
        return parse_keep_alive(body["keep_alive"])
    except ValueError as exc:
        raise APIError(400, f"Invalid value for 'keep_alive': {exc}", param="keep_alive",
                       code="invalid_value") from None


async def acquire(registry: ModelRegistry, name: str | None, keep_alive: Any) -> Lease:
    try:
        return await registry.acquire(name, keep_alive)
    except UnknownModelError as exc:
        raise unknown_model(exc) from None
    except ModelUnavailableError as exc:
        raise unavailable(exc) from None


def unknown_model(exc: UnknownModelError) -> APIError:
    return APIError(404, f"The model '{exc.name}' does not exist; available: {', '.join(exc.available)}",
                    code="model_not_found", param="model", ollama_message=f"model '{exc.name}' not found")


def unavailable(exc: ModelUnavailableError) -> APIError:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return APIError(503, str(exc), code=exc.code, headers=headers)


def serving_for(settings: Settings, entry: ModelEntry) -> dict[type[Serving], Serving]:
    """The endpoint families' serving objects for the entry's loaded engine, made once per load (and again when
    the model got another name: Ollama's /api/copy)."""
    made = entry.attachments.get("serving")
    if made is None or made[0] != entry.names:
        assert entry.client is not None
        mine = settings.alias_names and set(settings.alias_names) <= set(entry.spec.names)  # --model's only
        alias = settings.model_alias if mine else None
        own = settings.model_copy(update={"model": entry.spec.path, "model_alias": alias})
        if entry.spec.path != settings.model.absolute():  # --chat-template is --model's model's
            own = own.model_copy(update={"chat_template": None, "chat_template_file": None})
        made = entry.attachments["serving"] = (entry.names, build_serving(own, entry.client, entry.names))
    return cast(dict[type[Serving], Serving], made[1])


class LeasedResponse(Response):
    """A handler's response that releases the request's lease on its model once it has been sent (or the client
    has gone): a streamed answer keeps its model loaded until its last event."""

    def __init__(self, inner: Response, lease: Lease) -> None:  # noqa: super().__init__ would render a body
        self.inner = inner
        self.lease = lease
        self.status_code = inner.status_code
        self.raw_headers = inner.raw_headers
        self.background: BackgroundTask | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.inner(scope, receive, send)
        finally:
            self.lease.release()
        if self.background is not None:
            await self.background()
