"""A request body as a JSON object, or the 400 that says why it is not one (every endpoint family reads its body
with `json_object` before its pydantic model sees it)."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from edge_llm.api.errors import APIError
from edge_llm.api.request_context import request_context

# What may decode to a lone surrogate: a \ud800-\udfff escape, or its UTF-8-style bytes (json.loads decodes
# bytes with "surrogatepass"). A body with either is checked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_a_surrogate(raw: bytes) -> bool:
    # Substring tests first (memchr speed): the expression alone tries every backslash of the body, and a megabyte
    # of GBNF is mostly escaped quotes: 15 ms of the event loop for 350,000 of them, three times json.loads's.
    return (b"\\ud" in raw or b"\\uD" in raw or b"\xed" in raw) and _SURROGATE_ESCAPE.search(raw) is not None


async def request_json(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (`json_object`), parsed once a request and kept in its context (with
    its size): the model router and the family's serving object both read it, and a megabyte of JSON with 100,000
    members costs the event loop 0.05-0.3 s a parse (json.loads holds the GIL, so a thread would not spare the
    loop)."""
    context = request_context(request)
    if context.body is None:
        raw = await request.body()
        context.body_bytes = len(raw)
        context.body = json_object(raw)
    return context.body


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or the 400 that says why it is not one."""
    try:
        body = json.loads(raw)
        # A lone surrogate ("\ud800") decodes to a str that is not Unicode text: it would fail
        # later, when an answer or an error message quoting it is encoded (a 500). Refused here.
        if _may_hold_a_surrogate(raw) or b"\x00" in raw[:4]:  # (a UTF-16/32 body: always checked)
            json.dumps(body, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise APIError(400, "The request body is nested too deeply", code="invalid_json") from None
    except UnicodeEncodeError:
        raise APIError(400, "The request body contains a lone UTF-16 surrogate (a \\ud800-\\udfff escape "
                       "without its pair), which is not Unicode text", code="invalid_json") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of more than 4300 digits
        raise APIError(400, f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object", code="invalid_json")
    return body
