"""llama-server's server-wide flags, as its users pass them: --seed (a default seed for requests that give none),
--model-alias with several names and --tags (the model's other names and labels in /v1/models)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer
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
    unknown = httpx.post(flagged.url + CHAT, json={**SAMPLED, "model": "alpha,beta", "max_tokens": 1}, timeout=120)
    assert unknown.status_code == 404
    (card,) = httpx.get(flagged.url + "/v1/models", timeout=60).json()["data"]
    assert card["id"] == model_id
    assert {"alpha", "beta", "gamma"} <= set(card["aliases"]) and card["tags"] == ["coder", "small"]
    assert card["meta"]["alias"] == "alpha"
