"""The client request corpus (tests/fixtures/clients/, see its README) replayed against the real server: every
request a real client sent (captured from Codex CLI and Claude Code) or a real library built is answered 2xx, its
stream ends as its protocol ends one, and what the server does not read is reported, never refused.

To keep the replay fast on the shared default server, long strings (Codex's and Claude Code's 40-50 kB of
instructions and tool descriptions) are cut to their first STRING_CUT characters and the answer is capped at
NEW_TOKENS tokens: every key, item and nesting the client sent stays as it sent them. The agents' bodies made longer
than the default server's context get the protocol's own context-length error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer
from tests.helpers import sse_events

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
FIXTURES = sorted(CORPUS.glob("*/*.json"))
STRING_CUT = 60
NEW_TOKENS = 4
SENT_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta")
# The key that bounds the answer, per route.
LIMIT_KEY = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens", "/v1/messages": "max_tokens",
             "/v1/responses": "max_output_tokens", "/completion": "n_predict"}


def load(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text())
    source = record["source"]
    assert source["program"] and source["version"] and source["captured"] and source["how"], path
    return record


def shortened(value: Any) -> Any:
    if isinstance(value, str):
        return value[:STRING_CUT]
    if isinstance(value, list):
        return [shortened(item) for item in value]
    if isinstance(value, dict):
        return {key: shortened(item) for key, item in value.items()}
    return value


def bounded(path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = dict(body)
    if path.startswith("/api/"):  # Ollama
        body["options"] = {**body.get("options", {}), "num_predict": NEW_TOKENS}
    else:
        body[LIMIT_KEY[path]] = NEW_TOKENS
    return body


def send(server: RunningServer, record: dict[str, Any], body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    """The request as the client sent it (method, path, query, its protocol headers); the answer and, for a stream,
    its events (SSE data, or NDJSON lines)."""
    headers = {name: value for name, value in record["headers"].items() if name in SENT_HEADERS}
    url = server.url + record["path"] + (f"?{record['query']}" if record["query"] else "")
    with httpx.stream(record["method"], url, headers=headers, json=body, timeout=300) as response:
        if not streamed(record["path"], body) or response.status_code >= 300:
            response.read()
            return response, []
        if record["path"].startswith("/api/"):
            return response, [line for line in response.iter_lines() if line]
        return response, [f"{event}|{data}" for event, data in sse_events(response)]


def streamed(path: str, body: dict[str, Any]) -> bool:
    return bool(body.get("stream", path.startswith("/api/")))  # Ollama streams unless told not to


def assert_stream_ended(path: str, events: list[str]) -> None:
    assert events, "the stream sent nothing"
    if path in ("/v1/chat/completions", "/v1/completions"):
        assert events[-1] == "|[DONE]" or events[-1].endswith("|[DONE]"), events[-3:]
    elif path == "/completion":  # llama-server's own stream: no [DONE], the last object has "stop": true
        assert json.loads(events[-1].split("|", 1)[1])["stop"] is True, events[-3:]
    elif path == "/v1/responses":
        # response.incomplete when the NEW_TOKENS cap ended it: both are the stream's end
        assert events[-1].split("|", 1)[0] in ("response.completed", "response.incomplete"), events[-3:]
    elif path == "/v1/messages":
        assert events[-1].startswith("message_stop|"), events[-3:]
    else:
        assert json.loads(events[-1])["done"] is True, events[-3:]
    if path.startswith("/api/"):
        assert not any("error" in json.loads(line) for line in events), events
    else:  # an error event (Responses', Anthropic's) or an OpenAI chunk that is an error envelope
        assert not any(event.startswith(("error|", 'message|{"error"')) for event in events), events


def test_the_corpus_covers_the_clients() -> None:
    assert {path.parent.name for path in FIXTURES} >= {
        "codex", "claude-code", "openai-python", "anthropic-python", "langchain-ollama", "vercel-ai-sdk", "litellm",
        "llama-index", "continue", "open-webui"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_a_client_request_is_answered(server: RunningServer, path: Path) -> None:
    record = load(path)
    body = bounded(record["path"], shortened(record["body"]))
    response, events = send(server, record, body)
    assert 200 <= response.status_code < 300, response.text
    if streamed(record["path"], body):
        assert_stream_ended(record["path"], events)
    # Whatever the server does not read is named in the header (never a 400), each name a dotted path of the body.
    ignored = response.headers.get("x-edge-llm-ignored-fields", "")
    for name in filter(None, (part.strip() for part in ignored.split(","))):
        assert name.split(".")[0] in body, (name, sorted(body))


# The key that carries each agent's instructions: given twice, its first turn is a long session's prompt.
INSTRUCTIONS_KEY = {"/v1/responses": "input", "/v1/messages": "system"}


@pytest.mark.parametrize("client", ["codex", "claude-code"])
def test_an_agent_prompt_over_the_context_gets_the_protocols_error(server: RunningServer, client: str) -> None:
    """Codex's and Claude Code's first turns with their instructions given twice (12-24k tokens, over the default
    8192-token context) get their own protocol's context-length error, never a 500 or a cut prompt."""
    (path,) = (CORPUS / client).glob("*_first_turn.json")
    record = load(path)
    body = bounded(record["path"], record["body"])
    key = INSTRUCTIONS_KEY[record["path"]]
    body[key] = body[key] * 2
    response, _ = send(server, record, body)
    assert response.status_code == 400, response.text
    error = response.json()
    if record["path"] == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    else:
        assert error["error"]["code"] == "context_length_exceeded", error
    assert "context" in error["error"]["message"], error
