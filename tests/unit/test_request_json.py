"""A request's JSON body is parsed once however many readers it has (the model router, then the family's serving
object): a megabyte of JSON with 100,000 members costs the event loop up to 0.3 s a parse (issue 41); a lone
surrogate is refused however it is written."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.requests import Request

from edge_llm.api.errors import APIError
from edge_llm.api.request_context import CONTEXT_KEY, RequestContext, request_context
from edge_llm.api.telemetry import RequestRecord
from edge_llm.api.serving import body as body_module
from edge_llm.api.serving.body import json_object, request_json


def request_with(raw: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    context = RequestContext(RequestRecord("req", "POST", "/v1/chat/completions", 0.0))
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                    CONTEXT_KEY: context}, receive)


def test_the_body_is_parsed_once_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[bytes] = []
    real = body_module.json_object
    monkeypatch.setattr(body_module, "json_object", lambda raw: parses.append(raw) or real(raw))
    raw = json.dumps({"logit_bias": {str(i): 1 for i in range(1000)}}).encode()
    request = request_with(raw)

    async def read_twice() -> tuple[dict[str, Any], dict[str, Any]]:
        return await request_json(request), await request_json(request)

    first, second = asyncio.run(read_twice())
    assert first is second and len(first["logit_bias"]) == 1000
    assert parses == [raw]
    assert request_context(request).body is first and request_context(request).body_bytes == len(raw)


def test_a_body_that_is_not_json_is_refused_by_every_reader() -> None:
    request = request_with(b"{not json")

    async def read() -> None:
        await request_json(request)

    for _ in range(2):
        with pytest.raises(APIError) as caught:
            asyncio.run(read())
        assert caught.value.status == 400


@pytest.mark.parametrize("raw", [
    b'{"content": "\\ud800"}', b'{"content": "x\\uDBFFy"}', b'{"content": "\xed\xa0\x80"}',
    b'{"a": "' + b'\\"' * 1000 + b'", "content": "\\udfff"}',
], ids=["escape", "upper-case escape", "UTF-8-style bytes", "after many escaped quotes"])
def test_a_lone_surrogate_is_refused_however_it_is_written(raw: bytes) -> None:
    with pytest.raises(APIError, match="lone UTF-16 surrogate"):
        json_object(raw)


def test_a_surrogate_pair_and_escaped_backslashes_are_text() -> None:
    assert json_object(b'{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == {"a": "\U0001F600", "b": "\\ud800"}
