"""ASGI middleware that must see requests before FastAPI does."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_llm.api.errors import APIError


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
        response = error.response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)
