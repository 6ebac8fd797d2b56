"""Chat, Messages, Responses and Ollama serve one model through one core (api/serving/core.py): one prompt builder
(the chat template compiled once per model) and one grammar cache, so a JSON schema asked for through each of the
four families compiles into a grammar once, whichever family saw it first (the server's log says each time it
compiles one)."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import httpx

from edge_llm.testing.server import MODEL_ID, RunningServer

COMPILED = "compiled a JSON schema into a grammar"


def log_lines(server: RunningServer, message: str) -> list[dict[str, Any]]:
    lines = []
    for line in server.log().splitlines():
        if line.startswith("{") and message in line:
            record = json.loads(line)
            if record.get("msg") == message:
                lines.append(record)
    return lines


def post(server: RunningServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.url + path, json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def test_one_schema_through_four_families_compiles_once(server: RunningServer) -> None:
    key = f"answer_{uuid.uuid4().hex[:8]}"  # a schema no other test used
    schema = {"type": "object", "properties": {key: {"type": "string", "enum": ["yes", "no"]}},
              "required": [key], "additionalProperties": False}
    digest = hashlib.sha256(json.dumps(schema).encode()).hexdigest()[:16]
    question = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]

    chat = post(server, "/v1/chat/completions", {
        "messages": question, "max_tokens": 48,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}})
    messages = post(server, "/v1/messages", {
        "model": MODEL_ID, "messages": question, "max_tokens": 48,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    responses = post(server, "/v1/responses", {
        "input": "Is the sky blue? Answer in JSON.", "max_output_tokens": 48,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}})
    ollama = post(server, "/api/chat", {
        "messages": question, "stream": False, "format": schema, "options": {"num_predict": 48}})

    # Each answer followed the schema (the grammar was applied in every family) ...
    texts = [chat["choices"][0]["message"]["content"], messages["content"][0]["text"],
             responses["output"][0]["content"][0]["text"], ollama["message"]["content"]]
    for text in texts:
        assert json.loads(text)[key] in ("yes", "no"), texts
    # ... and the schema was compiled once.
    compiled = [record for record in log_lines(server, COMPILED) if record.get("schema_sha256") == digest]
    assert len(compiled) == 1, compiled


def test_the_chat_template_is_compiled_once_for_every_family(server: RunningServer) -> None:
    question = [{"role": "user", "content": "Say hi."}]
    post(server, "/v1/chat/completions", {"messages": question, "max_tokens": 2})
    post(server, "/v1/messages", {"model": MODEL_ID, "messages": question, "max_tokens": 2})
    post(server, "/v1/responses", {"input": "Say hi.", "max_output_tokens": 2})
    post(server, "/api/chat", {"messages": question, "stream": False, "options": {"num_predict": 2}})
    post(server, "/v1/messages/count_tokens", {"model": MODEL_ID, "messages": question})
    assert len(log_lines(server, "compiled the chat template")) == 1
