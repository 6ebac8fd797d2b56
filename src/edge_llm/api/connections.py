"""Bounds on the HTTP connections themselves, below the ASGI app: uvicorn's h11 protocol with three guards.

uvicorn times out only the idle gap between two requests (`timeout_keep_alive`). A connection that never sends a
complete request head (slowloris: one header byte every few seconds), or stops half-way through its body, would
otherwise hold its descriptor and buffers for ever, and enough of them exhaust RLIMIT_NOFILE so that no client, the
health probes included, can connect. So:

- head timeout: the whole request head must arrive within `head_timeout` seconds of the connection (or of the
  request's first byte on a kept-alive connection); else a raw 408 (when some of it came) and the connection closes;
- body timeout: while a request body is incomplete, `body_timeout` seconds without a byte close the connection; the
  app's pending read sees the client gone (a 499 in the access log and metrics, api/errors.py). A body whose
  reading is paused because the app has not consumed it yet is not the client's fault and is not timed;
- connection cap: past `max_connections` open connections a new one gets a raw 503 with Retry-After and is closed,
  so the process keeps descriptors for its model files, logs and probes instead of dying on EMFILE.

Each closing is a warning log line and counted in `edge_llm_connections_closed_total{reason}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

import h11
from prometheus_client import Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

from edge_llm.api.protocol.errors import openai_error, openai_error_type

logger = logging.getLogger(__name__)

# Descriptors kept out of the connection cap: model files, the log, the prefix-cache files, the listening socket,
# outgoing sockets (pulls), the stdlib's own.
DESCRIPTOR_RESERVE = 128


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout: float  # seconds for a whole request head; 0 = no limit
    body_timeout: float  # seconds without a body byte while the body is incomplete; 0 = no limit
    max_connections: int


def connection_cap(requested: int | None) -> int:
    """The cap asked for, or (None) the open-file limit less a reserve; never above that limit less the reserve."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = max(1, soft - DESCRIPTOR_RESERVE) if soft != resource.RLIM_INFINITY else 65536
    return ceiling if requested is None else min(requested, ceiling)


def _raw_response(status: int, reason: str, code: str, message: str, extra: str = "") -> bytes:
    """A response written on the socket itself (h11 cannot answer a request it has not read), in OpenAI's envelope."""
    body = json.dumps(openai_error(message, openai_error_type(status), code=code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode("ascii") + body


def protocol_class(limits: ConnectionLimits, closed: Counter) -> type[H11Protocol]:
    """uvicorn's `http=` protocol class, bound to these limits and to the metric counting the closings."""

    class BoundedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._close("over_capacity", _raw_response(
                    503, "Service Unavailable", "too_many_connections",
                    f"the server has {limits.max_connections} connections open, its limit: retry shortly",
                    "retry-after: 1\r\n"))
                return
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._cancel_timers()
                return
            their_state = self.conn.their_state
            if their_state is h11.IDLE:  # (part of) the next request's head
                if self._head_timer is None and self.conn.trailing_data[0]:
                    self._arm_head_timer()
            else:
                self._cancel(self._head_timer)
                self._head_timer = None
            self._cancel(self._body_timer)
            self._body_timer = None
            if their_state is h11.SEND_BODY and limits.body_timeout > 0:
                self._body_timer = self.loop.call_later(limits.body_timeout, self._body_expired)

        def _arm_head_timer(self) -> None:
            if limits.head_timeout > 0:
                self._head_timer = self.loop.call_later(limits.head_timeout, self._head_expired)

        def _head_expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if not self.conn.trailing_data[0] and self.cycle is not None:
                return  # kept alive between requests: uvicorn's keep-alive timeout owns that gap
            partial = bool(self.conn.trailing_data[0])
            self._close("head_timeout", _raw_response(
                408, "Request Timeout", "request_timeout", f"the request head did not arrive within {limits.head_timeout:g} s")
                if partial else b"")

        def _body_expired(self) -> None:
            self._body_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
                return
            waiting = self.cycle is not None and self.cycle.waiting_for_100_continue
            if self.flow.read_paused or waiting:  # the app has not read (or asked for) the body: not the client's delay
                self._body_timer = self.loop.call_later(limits.body_timeout, self._body_expired)
                return
            self._close("body_timeout", b"")

        def _close(self, reason: str, response: bytes) -> None:
            closed.labels(reason).inc()
            request: dict[str, Any] = {}
            if self.cycle is not None and self.conn.their_state is h11.SEND_BODY:
                request = {"method": self.scope["method"], "path": self.scope["path"]}
            logger.warning("connection closed by the server: %s", reason, extra={
                "reason": reason, "client": "%s:%d" % self.client if self.client else None, **request,
                "open_connections": len(self.connections)})
            self._cancel_timers()
            if response:
                self.transport.write(response)
            self.transport.close()

        def _cancel_timers(self) -> None:
            self._cancel(self._head_timer)
            self._cancel(self._body_timer)
            self._head_timer = self._body_timer = None

        @staticmethod
        def _cancel(timer: asyncio.TimerHandle | None) -> None:
            if timer is not None:
                timer.cancel()

    return BoundedH11Protocol
