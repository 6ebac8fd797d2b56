"""--deterministic on the real model: a temperature-0 or seeded request gives the same bytes whatever the prefix cache
holds, whatever runs beside it, however its prompt is chunked and whether it drafts (docs/determinism.md).

Each test sends the same body under conditions that change the arithmetic of the default mode (the same probes give
2-3 distinct answers of 5 there) and asserts one answer. The server's batch size is small so that the long system
prompt is prefilled in chunks, whose boundaries move with a cache hit and with the rows of batch mates."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from edge_llm.testing.server import MODEL_ID, RunningServer, run_server
from tests.helpers import sse_events

PARALLEL, CACHE_SLOTS, CTX = 4, 4, 8192  # a stream of 1,024 cells per sequence
SYSTEM = ("You are a careful assistant for a team that maintains a large Python code base. Answer precisely, name "
          "the standard library modules you use, and prefer short, idiomatic examples. " * 5)
QUESTION = "Explain how a hash map handles collisions, with a short Python example."
GREEDY: dict[str, Any] = {"temperature": 0}
SEEDED: dict[str, Any] = {"temperature": 1.0, "top_p": 0.95, "seed": 20261201}
TIMEOUT = 300


@pytest.fixture(scope="module")
def det_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("deterministic"), "--deterministic", "--parallel", str(PARALLEL),
                    "--cache-slots", str(CACHE_SLOTS), "--ctx-size", str(CTX), "--batch-size", "64") as running:
        yield running


@pytest.fixture(scope="module")
def det_client(det_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=det_server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def messages(question: str = QUESTION) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def answer(client: openai.OpenAI, sampling: dict[str, Any], chat: list[dict[str, str]] | None = None,
           **extra: Any) -> str:
    completion = client.chat.completions.create(model=MODEL_ID, messages=chat or messages(), max_tokens=48,
                                                **sampling, extra_body=extra or None)
    return completion.choices[0].message.content or ""


class Neighbours:
    """Other requests streaming while a probe runs: started, and each seen decoding, before the probe is sent."""

    def __init__(self, server: RunningServer, count: int) -> None:
        self.started = [threading.Event() for _ in range(count)]
        self.threads = [threading.Thread(target=self._run, args=(server, n), daemon=True) for n in range(count)]
        for thread in self.threads:
            thread.start()
        for event in self.started:
            assert event.wait(TIMEOUT), "a neighbour never started decoding"

    def _run(self, server: RunningServer, n: int) -> None:
        body = {"messages": messages(f"Write a long poem about the number {n}."), "max_tokens": 120,
                "temperature": 0.8, "stream": True}
        try:
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
                for line in response.iter_lines():
                    if line.startswith("data:") and '"content":' in line and '"content": ""' not in line:
                        self.started[n].set()
        finally:
            self.started[n].set()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(TIMEOUT)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_the_same_answer_cold_warm_beside_others_and_without_drafts(
        det_server: RunningServer, det_client: openai.OpenAI, sampling: dict[str, Any]) -> None:
    answers = {"cold": answer(det_client, sampling, cache_prompt=False)}
    answers["warm"] = answer(det_client, sampling)  # the system prompt and question from the cache
    answers["warm again"] = answer(det_client, sampling)  # now with the last answer's cells too
    neighbours = Neighbours(det_server, 3)
    answers["beside 3 others"] = answer(det_client, sampling)
    answers["cold beside 3 others"] = answer(det_client, sampling, cache_prompt=False)
    neighbours.join()
    answers["without drafts"] = answer(det_client, sampling, speculative=False)
    assert answers["cold"], answers
    assert set(answers.values()) == {answers["cold"]}, answers


def test_a_follow_up_turn_is_the_same_from_the_cache_and_cold(det_client: openai.OpenAI) -> None:
    first = answer(det_client, GREEDY, messages("Name three sorting algorithms."))
    follow_up = messages("Name three sorting algorithms.") + [
        {"role": "assistant", "content": first}, {"role": "user", "content": "Which of them is stable?"}]
    # warm: the first turn's cells, its answer decoded a row a step, come from the cache; cold: all prefilled
    warm = answer(det_client, GREEDY, follow_up)
    cold = answer(det_client, GREEDY, follow_up, cache_prompt=False)
    assert warm and warm == cold


def test_streamed_and_whole_answers_are_the_same_and_n_choices_repeat(
        det_server: RunningServer, det_client: openai.OpenAI) -> None:
    whole = answer(det_client, SEEDED)
    body = {"model": MODEL_ID, "messages": messages(), "max_tokens": 48, "stream": True, **SEEDED}
    with httpx.stream("POST", det_server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
        chunks = [json.loads(data) for _, data in sse_events(response) if data != "[DONE]"]
    pieces = [chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"]]
    assert "".join(pieces) == whole
    # n = 2: the second choice follows the first's prefill (a copy between KV streams); the pair repeats
    pairs = [[choice.message.content for choice in det_client.chat.completions.create(
        model=MODEL_ID, messages=messages("Suggest a name for a cat."), max_tokens=16, n=2, **SEEDED,
        extra_body={"cache_prompt": cache}).choices] for cache in (False, True, True)]
    assert pairs[0] == pairs[1] == pairs[2], pairs


def test_each_sequence_has_its_own_context(det_server: RunningServer) -> None:
    per_sequence = CTX // (PARALLEL + CACHE_SLOTS)
    listed = httpx.get(det_server.url + "/v1/models", timeout=60).json()["data"][0]
    assert listed["meta"]["n_ctx"] == per_sequence
    too_long = {"prompt": "word " * (per_sequence + 50), "max_tokens": 4}
    response = httpx.post(det_server.url + "/v1/completions", json=too_long, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and str(per_sequence) in error["message"]
