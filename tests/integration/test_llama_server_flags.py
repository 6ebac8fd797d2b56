"""llama-server's server-wide flags, as its users pass them: --seed (a default seed for requests that give none),
--model-alias with several names and --tags (the model's other names and labels in /v1/models; answers name the model as the request did), --chat-template
and --chat-template-file (a built-in name or a Jinja template instead of the GGUF's; a bad one stops start-up)."""

from __future__ import annotations

from typing import Any

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from edge_llm.testing.server import MODEL, RunningServer, free_port
from tests.server_pool import ServerWith

CHAT = "/v1/chat/completions"
SAMPLED: dict[str, Any] = {"messages": [{"role": "user", "content": "Name three colours and a poem title."}],
                           "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def flagged(server_with: ServerWith) -> RunningServer:
    return server_with("--parallel", "1", "--cache-slots", "0", "--seed", "1234", "--model-alias", "alpha, beta,gamma",
                       "--tags", "coder,small")


def _text(server: RunningServer, body: dict[str, Any]) -> str:
    response = httpx.post(server.url + CHAT, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_server_seed_makes_sampled_requests_without_a_seed_repeat(flagged: RunningServer) -> None:
    first = _text(flagged, SAMPLED)
    assert first and _text(flagged, SAMPLED) == first
    # A request's own seed still wins over the server's.
    own = [_text(flagged, {**SAMPLED, "seed": seed}) for seed in (1, 2, 3)]
    assert len(set(own)) > 1, own


def test_every_alias_names_the_model_and_the_list_shows_aliases_and_tags(flagged: RunningServer, model_id: str
                                                                         ) -> None:
    for name in ("alpha", "beta", "gamma", model_id):
        response = httpx.post(flagged.url + CHAT, json={**SAMPLED, "model": name, "max_tokens": 1}, timeout=120)
        assert response.status_code == 200, (name, response.text)
        assert response.json()["model"] == name  # the name the client used, as llama-server echoes it
    with httpx.stream("POST", flagged.url + CHAT, timeout=120,
                      json={**SAMPLED, "model": "gamma", "max_tokens": 1, "stream": True}) as streamed:
        first = next(line for line in streamed.iter_lines() if line.startswith("data: {"))
    assert json.loads(first.removeprefix("data: "))["model"] == "gamma"
    message = httpx.post(flagged.url + "/v1/messages", timeout=120, headers={"anthropic-version": "2023-06-01"},
                         json={"model": "beta", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
    assert message.status_code == 200 and message.json()["model"] == "beta", message.text
    unknown = httpx.post(flagged.url + CHAT, json={**SAMPLED, "model": "alpha,beta", "max_tokens": 1}, timeout=120)
    assert unknown.status_code == 404
    (card,) = httpx.get(flagged.url + "/v1/models", timeout=60).json()["data"]
    assert card["id"] == model_id
    assert {"alpha", "beta", "gamma"} <= set(card["aliases"]) and card["tags"] == ["coder", "small"]
    assert card["meta"]["alias"] == "alpha"


# The messages' contents, nothing else: the prompt is exactly their tokens.
BARE_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "contents_only.jinja"


def test_chat_template_file_replaces_the_models_template(server_with: ServerWith) -> None:
    templated = server_with("--parallel", "1", "--chat-template-file", str(BARE_FILE))
    text = "Hello there, how are you?"
    tokens = httpx.post(templated.url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    response = httpx.post(templated.url + CHAT, timeout=120,
                          json={"messages": [{"role": "user", "content": text}], "max_tokens": 1})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == len(tokens)  # the GGUF's template adds Qwen's turns


@pytest.mark.parametrize(("value", "said"), [
    ("{% for m in messages %}{{ m['content'] ", "--chat-template: the chat template does not compile"),
    ("{{ raise_exception('no such role') }}",
     "--chat-template fails on a conversation of one user message: no such role"),
    ("llama-9", "--chat-template is neither a built-in template name (chatml, gemma, llama2, llama3"),
])
def test_a_bad_chat_template_stops_the_server_before_loading(value: str, said: str) -> None:
    result = subprocess.run([sys.executable, "-m", "edge_llm", "serve", "--model", str(MODEL), "--port",
                             str(free_port()), "--chat-template", value], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"edge-llm: error: {said}"), result.stderr
    assert "model loaded" not in result.stderr
