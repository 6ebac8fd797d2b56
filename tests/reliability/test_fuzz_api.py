"""API fuzzing with schemathesis against the server's own /openapi.json (issue 6).

Every operation of the live document gets positive cases (valid by the schema) and, where it has inputs,
negative ones (schema violations, wrong types, raw non-JSON and non-UTF-8 bodies); NUL bytes are allowed in
strings. On top of that, every generated JSON body is also sent once with invalid UTF-8 and once with a lone
surrogate escape inside a string. Whatever comes: no 5xx, every 4xx in OpenAI's error envelope (Anthropic's on
/v1/messages), every stream ends properly, and afterwards the server still serves. `EDGE_LLM_FUZZ_EXAMPLES`
(default 12) sets the examples per operation and mode.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from edge_llm.testing.server import RunningServer
from tests.reliability.support import (
    HOSTILE_FLAGS,
    Samples,
    TIMEOUT,
    assert_envelope,
    assert_no_unhandled_errors,
    assert_serving,
    env_int,
    metric,
    scrape,
    wait_idle,
)
from tests.server_pool import ServerWith

EXAMPLES = env_int("EDGE_LLM_FUZZ_EXAMPLES", 12)
# schemathesis stops reading an event stream after 20 events (its default `max-stream-events`) and closes the
# connection: the server sees a client leaving, and the body ends mid-stream without its end marker. The largest
# stream here (8 choices of 8 tokens each, a finish chunk per choice, usage, [DONE]; the Responses API's events) is
# far below this, so every stream is read to its end.
MAX_STREAM_EVENTS = 10_000

# Every operation of /openapi.json; test_every_documented_operation_is_fuzzed keeps this list honest.
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("GET", "/v1/responses/{response_id}/input_items"),
    ("POST", "/v1/responses/{response_id}/cancel"),
    ("POST", "/infill"),
    ("POST", "/completion"),
    ("POST", "/apply-template"),
    ("GET", "/props"),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/models/load"),
    ("POST", "/models/unload"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("POST", "/api/embed"),
    ("POST", "/api/embeddings"),
    ("GET", "/api/tags"),
    ("POST", "/api/show"),
    ("GET", "/api/ps"),
    ("GET", "/api/version"),
    ("POST", "/api/pull"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/copy"),
]
RESPONSES_END = re.compile(rb"event: response\.(completed|incomplete|failed)\n[^\n]*\n\n$")
INFILL_END = re.compile(rb'data: \{[^\n]*("stop": true|"error": )[^\n]*\}\n\n$')  # llama-server's: no [DONE]
# The operations without a body have no negative case to generate (any string is a valid model or response id);
# their negative side is test_wrong_methods_and_unknown_paths_get_the_envelope (and the positive cases'
# random ids, which get 404 envelopes).
WITHOUT_BODY = {("POST", "/v1/responses/{response_id}/cancel")}
WITH_INPUTS = [op for op in OPERATIONS
               if (op[0] == "POST" and op not in WITHOUT_BODY) or op == ("DELETE", "/api/delete")]


@pytest.fixture(scope="module")
def fuzz_server(server_with: ServerWith) -> RunningServer:
    return server_with(*HOSTILE_FLAGS)  # shared with test_hostile_inputs.py


@pytest.fixture(scope="module")
def before_fuzzing(fuzz_server: RunningServer) -> Samples:
    """The metrics before any fuzzing (start-up polled /readyz while the model loaded: 503 "loading")."""
    return scrape(fuzz_server)


@pytest.fixture(scope="module")
def api_schema(fuzz_server: RunningServer, before_fuzzing: Samples) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json", timeout=60)
    schema.config.generation.update(allow_x00=True)  # NUL characters inside generated strings
    schema.config.max_stream_events = MAX_STREAM_EVENTS
    return schema


def operation_of(schema: schemathesis.BaseSchema, method: str, path: str) -> Any:
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() == method and operation.path == path:
            return operation
    raise AssertionError(f"{method} {path} is not in /openapi.json")


def anthropic_envelope(status: int, body: bytes, where: str) -> dict[str, Any]:
    """Anthropic's envelope (the /v1/messages routes): {"type": "error", "error": {"type", "message", "details"}}."""
    parsed = json.loads(body)
    assert parsed.get("type") == "error" and set(parsed) == {"type", "error"}, f"{where}: {status} {parsed!r:.300}"
    error = parsed["error"]
    assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["message"], where
    return {"code": (error.get("details") or {}).get("error_code"), **error}


def ollama_envelope(status: int, body: bytes, where: str) -> dict[str, Any]:
    """Ollama's envelope (the /api/* routes): {"error": "message"}; it has no code."""
    parsed = json.loads(body)
    assert isinstance(parsed, dict) and set(parsed) == {"error"}, f"{where}: {status} {parsed!r:.300}"
    assert isinstance(parsed["error"], str) and parsed["error"], f"{where}: {status} {parsed!r:.300}"
    return {"code": None, "message": parsed["error"]}


def envelope(path: str, status: int, body: bytes, where: str) -> dict[str, Any]:
    if path.startswith("/v1/messages"):
        return anthropic_envelope(status, body, where)
    if path.startswith("/api/"):
        return ollama_envelope(status, body, where)
    return assert_envelope(status, body, where)


def check_answer(path: str, status: int, headers: dict[str, str], body: bytes, where: str) -> None:
    assert status < 500, f"{where}: {status} {body[:500]!r}"
    if status >= 400:
        envelope(path, status, body, where)
        return
    content_type = headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        # A stream ends with its end marker: [DONE] (OpenAI shapes), a done / error event (simple body),
        # message_stop (Anthropic's), the Responses API's last event (response.completed / incomplete / failed),
        # or /infill's final object (stop: true) or error.
        assert (body.endswith(b"data: [DONE]\n\n") or b"event: done\n" in body or b"event: error\n" in body
                or b"event: message_stop\n" in body or RESPONSES_END.search(body) or INFILL_END.search(body)), \
            f"{where}: the stream did not end properly: {body[-300:]!r}"
    elif content_type.startswith("application/x-ndjson"):
        # Ollama's streams: one JSON object a line, the last one `done`, a pull's success, or an error.
        # Split on "\n" only, as Ollama's clients do: str.splitlines() would also split inside a string holding
        # U+2028 (text beyond ASCII is written as is).
        lines = [json.loads(line) for line in body.decode("utf-8").split("\n") if line]
        assert lines and (lines[-1].get("done") is True or lines[-1].get("status") == "success"
                          or lines[-1].get("error")), \
            f"{where}: the stream did not end properly: {body[-300:]!r}"
    elif content_type.startswith("application/json"):
        json.loads(body)


def mutated_bodies(body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The body with invalid UTF-8, and with a lone surrogate escape, at the start of its first string value."""
    text = json.dumps(body)  # ASCII only: every non-ASCII character is an escape
    cut = text.find('": "')
    if cut < 0:
        return []
    cut += len('": "')
    return [
        ("invalid UTF-8", text[:cut].encode() + b"\xff\xc0\xaf" + text[cut:].encode()),
        ("lone surrogate", (text[:cut] + "\\ud800" + text[cut:]).encode()),
    ]


def fuzz(server: RunningServer, schema: schemathesis.BaseSchema, method: str, path: str,
         mode: GenerationMode) -> int:
    operation = operation_of(schema, method, path)
    sent = [0]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        where = f"{mode.value} {method} {path}: {case.as_curl_command()[:800]}"
        response = case.call(base_url=server.url, timeout=TIMEOUT)
        sent[0] += 1
        assert not response.stream_cut_short, f"{where}: the client stopped reading the stream (not the server)"
        check_answer(path, response.status_code, {k.lower(): v[0] for k, v in response.headers.items()},
                     response.content, where)
        if isinstance(case.body, dict):
            for name, raw in mutated_bodies(case.body):
                mutated = httpx.request(method, server.url + case.formatted_path, content=raw, timeout=TIMEOUT,
                                        headers={"content-type": "application/json"})
                sent[0] += 1
                assert mutated.status_code == 400, f"{name}: {where}: {mutated.status_code} {mutated.text[:300]}"
                error = envelope(path, 400, mutated.content, where)
                assert error["code"] == "invalid_json" or path.startswith("/api/"), error  # Ollama's has no code

    run()
    return sent[0]


def test_a_stream_of_many_events_is_read_to_its_end(fuzz_server: RunningServer,
                                                    api_schema: schemathesis.BaseSchema) -> None:
    """The CI flake of a streamed completion with n=7 cut without [DONE]: schemathesis had stopped reading it."""
    operation = operation_of(api_schema, "POST", "/v1/completions")
    case = operation.Case(body={"prompt": "\n", "stream": True, "n": 7, "max_tokens": 8, "ignore_eos": True,
                                "cache_prompt": False}, media_type="application/json")
    response = case.call(base_url=fuzz_server.url, timeout=TIMEOUT)
    events = [block for block in response.content.split(b"\n\n") if block.startswith(b"data: ")]
    assert not response.stream_cut_short and response.content.endswith(b"data: [DONE]\n\n"), response.content[-300:]
    assert len(events) > 20, f"only {len(events)} events: the case no longer tells"  # schemathesis's default: 20
    finished = [json.loads(block[6:])["choices"][0] for block in events[:-1]]
    reasons = sorted((c["index"], c["finish_reason"]) for c in finished if c["finish_reason"] is not None)
    assert [index for index, _ in reasons] == list(range(7)), reasons  # every choice ended, once


def test_every_documented_operation_is_fuzzed(api_schema: schemathesis.BaseSchema) -> None:
    documented = {(result.ok().method.upper(), result.ok().path) for result in api_schema.get_all_operations()}
    assert documented == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_positive_cases(fuzz_server: RunningServer, api_schema: schemathesis.BaseSchema, method: str,
                        path: str) -> None:
    assert fuzz(fuzz_server, api_schema, method, path, GenerationMode.POSITIVE) >= 1


@pytest.mark.parametrize(("method", "path"), WITH_INPUTS, ids=[f"{m} {p}" for m, p in WITH_INPUTS])
def test_negative_cases(fuzz_server: RunningServer, api_schema: schemathesis.BaseSchema, method: str,
                        path: str) -> None:
    assert fuzz(fuzz_server, api_schema, method, path, GenerationMode.NEGATIVE) >= 1


def test_wrong_methods_and_unknown_paths_get_the_envelope(fuzz_server: RunningServer) -> None:
    for method, path in OPERATIONS:
        concrete = path.replace("{model_id}", "x")
        for wrong in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            if wrong == method:
                continue
            response = httpx.request(wrong, fuzz_server.url + concrete, content=b"{}", timeout=TIMEOUT)
            where = f"{wrong} {concrete}"
            # /v1/models/{id} answers GET only; a POST to the template's path is a 405, not a 404.
            assert response.status_code in (404, 405), f"{where}: {response.status_code} {response.text[:300]}"
            envelope(concrete, response.status_code, response.content, where)
    for path in ("/nope", "/v1", "/v1/chat", "/%00", "/v1/models/../../etc/passwd", "/" + "a" * 4000):
        response = httpx.get(fuzz_server.url + path, timeout=TIMEOUT)
        assert 400 <= response.status_code < 500, (path, response.status_code)
        assert_envelope(response.status_code, response.content, path)


def test_the_server_still_serves_after_fuzzing(fuzz_server: RunningServer, before_fuzzing: Samples) -> None:
    samples = wait_idle(fuzz_server)
    server_errors = {labels: value - before_fuzzing.get((name, labels), 0.0)
                     for (name, labels), value in samples.items()
                     if name == "edge_llm_http_requests_total" and dict(labels)["status"].startswith("5")}
    assert not any(server_errors.values()), server_errors
    assert metric(samples, "edge_llm_http_requests_total", route="/v1/chat/completions", method="POST",
                  status="200") >= 1
    assert_serving(fuzz_server)
    assert metric(scrape(fuzz_server), "edge_llm_engine_alive") == 1
    assert_no_unhandled_errors(fuzz_server)
