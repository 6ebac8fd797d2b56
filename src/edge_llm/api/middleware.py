"""ASGI middleware that must see requests before FastAPI does.

`RequestTracking` is the outermost layer (see `app.create_app`): it makes the request's context
(api/request_context.py: id, record, body, ignored fields, timings), writes the access line and HTTP metrics,
keeps the in-flight count and the send timeout that disconnects clients who stop reading.
The others refuse early: too many headers, shutting down, body too large.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import Sequence
from email.utils import formatdate
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_llm.api.errors import APIError
from edge_llm.api.lifecycle import Lifecycle
from edge_llm.api.params import IGNORED_FIELDS_HEADER, ignored_fields_header
from edge_llm.api.request_context import CONTEXT_KEY, RequestContext
from edge_llm.api.telemetry import RequestRecords
from edge_llm.logs import bind_subject, new_request_id, sane_request_id, unbind_subject
from edge_llm.api.metrics import Metrics

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("edge_llm.access")

OPEN_PATHS = frozenset({"/healthz", "/health", "/readyz"})  # no key, no Host check: probes must always reach them
QUIET_PATHS = OPEN_PATHS | {"/metrics"}  # not "in flight", served while draining, access line at debug level

# Error codes that count as a rejection, and under which reason.
_REJECTION_BY_CODE = {
    "invalid_api_key": "auth",
    "host_not_allowed": "host_not_allowed",
    "origin_not_allowed": "origin_not_allowed",
    "request_too_large": "body_too_large",
    "request_headers_too_large": "headers_too_large",
    "context_length_exceeded": "context_too_long",
    "queue_full": "queue_full",
    "shutting_down": "shutting_down",
    "engine_unavailable": "engine_unavailable",
    "model_memory_busy": "model_memory_busy",
}


_date_cache: tuple[int, bytes] = (0, b"")


def _http_date() -> bytes:
    """The Date header, formatted once a second (uvicorn's own one needs its loop to wake every 0.1 s: cli/main.py)."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode())
    return _date_cache[1]


def _abort_connection(send: Send) -> None:
    """Best effort: uvicorn's `send` is a method of its request cycle, which holds the transport.
    Aborting (not closing) drops the unsent buffer, so a client that never reads cannot hold it."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()


_STREAM_UNSENT_BYTES = 4096
_STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson")  # SSE, and NDJSON (Ollama's streams)


def _bound_stream_buffering(send: Send) -> None:
    """Best effort, for event streams: keep at most ~4 KB unsent in the kernel (TCP_NOTSENT_LOWAT)
    and in the transport, so tokens are not queued behind megabytes of buffer and a client that
    stops reading blocks `send` soon (and meets the send timeout) instead of after minutes."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        return
    try:
        transport.set_write_buffer_limits(high=_STREAM_UNSENT_BYTES)
        sock = transport.get_extra_info("socket")
        lowat = getattr(socket, "TCP_NOTSENT_LOWAT", 25)  # 25 on Linux, where Python may not name it
        if sock is not None and sys.platform.startswith("linux"):
            sock.setsockopt(socket.IPPROTO_TCP, lowat, _STREAM_UNSENT_BYTES)
    except (AttributeError, OSError, ValueError):
        pass


class RequestTracking:
    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        records: RequestRecords,
        lifecycle: Lifecycle,
        routes: Sequence[BaseRoute],
        send_timeout: float,
        log_prompts: bool,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.records = records
        self.lifecycle = lifecycle
        self.routes = routes
        self.send_timeout = send_timeout
        self.log_prompts = log_prompts
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = self.records.open(
            sane_request_id(Headers(scope=scope).get("x-request-id")) or new_request_id(),
            scope["method"], scope["path"], time.monotonic(),
        )
        context = scope[CONTEXT_KEY] = RequestContext(record)
        token = bind_subject(context)
        counted = scope["path"] not in QUIET_PATHS
        if counted:
            self.lifecycle.in_flight += 1
        id_header = (b"x-request-id", record.request_id.encode())
        ignored_fields = context.ignored_fields
        request_body: bytearray | None = bytearray() if self.log_prompts and counted else None
        send_timeout = self.send_timeout

        async def receive_and_keep() -> Message:
            message = await receive()
            if request_body is not None and message["type"] == "http.request":
                if len(request_body) <= self.max_body_bytes:
                    request_body.extend(message.get("body", b""))
            return message

        async def send_and_watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"]
                headers.append(id_header)
                headers.append((b"date", _http_date()))
                if ignored_fields and not any(k.lower() == IGNORED_FIELDS_HEADER.encode() for k, _ in headers):
                    headers.append((IGNORED_FIELDS_HEADER.encode(), ignored_fields_header(ignored_fields)))
                message = {**message, "headers": headers}
                if record.status < 400 and send_timeout > 0 and any(
                        k.lower() == b"content-type" and v.startswith(_STREAM_TYPES) for k, v in headers):
                    _bound_stream_buffering(send)
            elif message["type"] == "http.response.body":
                if send_timeout > 0:
                    try:
                        with anyio.fail_after(send_timeout):
                            await send(message)
                    except TimeoutError:
                        record.idle_timeout = True
                        self.metrics.idle_disconnects.inc()
                        logger.warning("the client read nothing for %.0f s; closing the connection", send_timeout)
                        _abort_connection(send)
                        raise
                    return
            await send(message)

        try:
            await self.app(scope, receive_and_keep if request_body is not None else receive, send_and_watch)
        except BaseException as exc:
            if not record.status:  # 499: the client went away before an answer (nginx's convention)
                record.status = 499 if isinstance(exc, asyncio.CancelledError) else 500
            raise
        finally:
            if counted:
                self.lifecycle.in_flight -= 1
            self.records.close(record)
            try:
                self._account(scope, context, request_body)
            finally:
                unbind_subject(token)

    def _route(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:  # refused before routing: find the route it was meant for
            for candidate in self.routes:
                if candidate.matches(scope)[0] is not Match.NONE:
                    route = candidate
                    break
        return getattr(route, "path", None) or "unmatched"

    def _account(self, scope: Scope, context: RequestContext, request_body: bytearray | None) -> None:
        record = context.record
        duration = time.monotonic() - record.started
        route = self._route(scope)
        metrics = self.metrics
        metrics.http_requests.labels(route, record.method, str(record.status)).inc()
        metrics.http_duration.labels(route).observe(duration)
        reason = _REJECTION_BY_CODE.get(record.error_code or "") if record.status >= 400 else None
        if reason is not None:
            metrics.rejections.labels(reason).inc()

        fields: dict[str, Any] = {
            "method": record.method,
            "path": record.path,
            "status": record.status,
            "duration_ms": round(duration * 1000, 1),
        }
        client = scope.get("client")
        if client:
            fields["client"] = client[0]
        if record.model:
            fields["model"] = record.model
        if record.prompt_tokens is not None:
            fields.update(prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
                          cached_tokens=record.cached_tokens)
        if record.first_token_at:
            fields["ttft_ms"] = round((record.first_token_at - record.started) * 1000, 1)
        if record.finish_reason:
            fields["finish_reason"] = record.finish_reason
        if record.error_code:
            fields["error_code"] = record.error_code
        if record.idle_timeout:
            fields["idle_timeout"] = True
        if request_body is not None:
            fields["prompt"] = _prompt_of(context.body, bytes(request_body))
            fields["output"] = record.output
        level = logging.DEBUG if record.path in QUIET_PATHS else logging.INFO
        access_logger.log(level, "%s %s %d", record.method, record.path, record.status, extra=fields)


def _prompt_of(parsed: dict[str, Any] | None, body: bytes) -> Any:
    """The prompt of a body (--log-prompts): from the parsed body when the request got that far (it is not parsed
    again), else the raw body's start."""
    if parsed is None:
        try:
            parsed = json.loads(body)
        except ValueError:
            return body[:4096].decode("utf-8", "replace")
    if isinstance(parsed, dict):
        return parsed.get("messages", parsed.get("prompt"))
    return None


class HeaderLimit:
    """More than `max_headers` request headers, or more than `max_bytes` of them, → 431.

    The HTTP parser (h11) also refuses a head that grows past twice `max_bytes` while still
    incomplete, with a plain 400, so a slow client cannot make the server buffer an endless head.
    """

    def __init__(self, app: ASGIApp, max_headers: int, max_bytes: int) -> None:
        self.app = app
        self.max_headers = max_headers
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            message = None
            if len(headers) > self.max_headers:
                message = f"The request has {len(headers)} headers; at most {self.max_headers} are accepted"
            else:
                size = sum(len(k) + len(v) + 4 for k, v in headers)  # "name: value\r\n"
                if size > self.max_bytes:
                    message = f"The request headers take {size} bytes; at most {self.max_bytes} are accepted"
            if message is not None:
                error = APIError(431, message, code="request_headers_too_large", error_type="invalid_request_error",
                                 headers={"connection": "close"})
                await error.response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ShutdownGate:
    """While draining for shutdown, new requests get 503 `shutting_down` (probes and metrics still answer)."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.lifecycle.draining and scope["path"] not in QUIET_PATHS:
            error = APIError(503, "The server is shutting down", code="shutting_down",
                             headers={"retry-after": "5", "connection": "close"})
            await error.response(scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """Refuses bodies over `max_bytes` with 413, by Content-Length up front or by counting a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            413, f"The request body is larger than {self.max_bytes} bytes", code="request_too_large"
        )
        response = error.response(scope["path"])
        response.headers["connection"] = "close"
        await response(scope, receive, send)
