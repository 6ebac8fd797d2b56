"""Newline-delimited JSON, Ollama's streaming format: the one framer (`encode_line`) and a streaming response that
notices a client leaving without polling (EventStreamResponse's machinery: the ASGI `http.disconnect` event cancels
the body and aborts the engine work)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from edge_llm.api.sse import EventStreamResponse

MEDIA_TYPE = "application/x-ndjson"


def encode_line(payload: Mapping[str, Any]) -> bytes:
    """One object on one line, compact as Go's encoding/json writes it (text beyond ASCII stays UTF-8)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


class NdjsonResponse(EventStreamResponse):
    """Streams `body` (lines from `encode_line`) as application/x-ndjson, cancelled as soon as the client leaves.

    No keep-alive: NDJSON has no comment line, and Ollama's clients parse every line they read as JSON."""

    media_type = MEDIA_TYPE

    def __init__(
        self,
        body: AsyncIterator[bytes],
        *,
        headers: dict[str, str] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        keepalive_interval: float = 0.0,  # noqa: ARG002 - the signature of EventStreamResponse; always off here
    ) -> None:
        super().__init__(body, headers=headers, on_disconnect=on_disconnect, keepalive_interval=0.0)

    def note(self, text: str) -> None:  # noqa: ARG002 - NDJSON has no comment line: progress notes are dropped
        return None
