"""Many models in one server, on the real models (the default model and gemma-3-270m): both answer concurrently,
a request's `model` picks its engine, the first request loads it (others wait on the same load), an idle model
unloads after its keep-alive and its memory is returned, the memory budget refuses with the documented 503 and
recovers, an unknown model is a 404 listing the available ones."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.testing.server import MODEL, MODEL_ID, RunningServer, require_model, run_server
from tests.helpers import metric, scrape, small_model, wait_for

pytestmark = pytest.mark.integration

GEMMA = "gemma-3-270m"  # the catalogue name: an accepted alias of gemma-3-270m-q4_k_m
GEMMA_ID = GEMMA_3_270M.filename.removesuffix(".gguf")
SMALL = ("--ctx-size", "2048", "--parallel", "2", "--cache-slots", "2")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding both models (links); gemma-3-270m is fetched when missing (`edge-llm model fetch`)."""
    gemma = small_model()
    directory = tmp_path_factory.mktemp("models")
    (directory / MODEL.name).symlink_to(require_model())
    (directory / gemma.name).symlink_to(gemma)
    return directory


@pytest.fixture
def serve(models: Path, tmp_path: Path) -> Iterator[Any]:
    servers: list[Any] = []

    def start(*flags: str) -> RunningServer:
        context = run_server(tmp_path, "--models-dir", str(models), *SMALL, *flags, model=None)
        servers.append(context)
        return context.__enter__()

    yield start
    for context in reversed(servers):
        context.__exit__(None, None, None)


def states(server: RunningServer) -> dict[str, str]:
    return {card["id"]: card["state"] for card in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}


def in_flight(server: RunningServer, model: str) -> int:
    card = httpx.get(f"{server.url}/v1/models/{model}", timeout=30).json()
    return int(card["meta"]["requests_in_flight"])


def complete(server: RunningServer, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=300)


def rss_anon_kib(server: RunningServer) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/PID/status")


def test_both_models_answer_concurrently_each_loaded_by_its_first_request(serve: Any) -> None:
    server = serve()
    assert states(server) == {MODEL_ID: "unloaded", GEMMA_ID: "unloaded"}
    assert httpx.get(server.url + "/readyz").status_code == 200  # ready with nothing loaded: requests load
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    answers: dict[str, Any] = {}

    def chat() -> None:
        answers["qwen"] = client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)

    def gemma() -> None:
        answers["gemma"] = client.completions.create(model=GEMMA, prompt="The capital of France is", max_tokens=8,
                                                     temperature=0)

    threads = [threading.Thread(target=chat), threading.Thread(target=gemma)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers["qwen"].model == MODEL_ID and answers["qwen"].choices[0].message.content
    assert answers["gemma"].model == GEMMA and answers["gemma"].choices[0].text  # the name it was asked by
    for answer in answers.values():  # each waited for its model's load, and says so
        assert answer.model_extra["timings"]["load_ms"] > 0
    assert states(server) == {MODEL_ID: "loaded", GEMMA_ID: "loaded"}
    again = complete(server, GEMMA).json()
    assert "load_ms" not in again["timings"]  # loaded: no wait
    samples = scrape(server)
    assert metric(samples, "edge_llm_model_loads_total", model=GEMMA_ID) == 1
    assert metric(samples, "edge_llm_model_state", model=GEMMA_ID, state="loaded") == 1
    assert metric(samples, "edge_llm_model_generated_tokens_total", model=MODEL_ID) > 0


def test_an_unknown_model_is_a_404_and_a_base_model_refuses_chat_and_fill_in_the_middle(serve: Any) -> None:
    server = serve("--api-key", "k")
    auth = {"Authorization": "Bearer k"}
    openai_404 = httpx.post(server.url + "/v1/chat/completions", headers=auth, timeout=30,
                            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert openai_404.status_code == 404 and openai_404.json()["error"]["code"] == "model_not_found"
    message = openai_404.json()["error"]["message"]
    assert MODEL_ID in message and GEMMA_ID in message and GEMMA in message
    anthropic_404 = httpx.post(server.url + "/v1/messages", headers=auth, timeout=30,
                               json={"model": "claude-x", "max_tokens": 8,
                                     "messages": [{"role": "user", "content": "hi"}]})
    assert anthropic_404.status_code == 404 and anthropic_404.json()["error"]["type"] == "not_found_error"
    assert GEMMA_ID in anthropic_404.json()["error"]["message"]
    assert httpx.post(server.url + "/models/load", json={"model": GEMMA}).status_code == 401  # behind the key
    chat = httpx.post(server.url + "/v1/chat/completions", headers=auth, timeout=300,
                      json={"model": GEMMA, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_template_missing"
    assert "/v1/completions" in chat.json()["error"]["message"]
    # Gemma 3 has no fill-in-the-middle tokens: /infill and a completion with a suffix say so.
    infill = httpx.post(server.url + "/infill", headers=auth, timeout=300,
                        json={"model": GEMMA, "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n"})
    assert infill.status_code == 400 and infill.json()["error"]["code"] == "fim_not_supported", infill.text
    assert "fill-in-the-middle" in infill.json()["error"]["message"]
    suffixed = httpx.post(server.url + "/v1/completions", headers=auth, timeout=300,
                          json={"model": GEMMA, "prompt": "def add(a, b):\n    ", "suffix": "\n", "max_tokens": 8})
    assert suffixed.status_code == 400 and suffixed.json()["error"]["code"] == "fim_not_supported"
    assert suffixed.json()["error"]["param"] == "suffix"


def test_an_idle_model_unloads_after_its_keep_alive_and_its_memory_is_returned(serve: Any) -> None:
    server = serve()
    # A first load and unload (keep_alive 0) leaves what stays for good: llama.cpp and its Python modules.
    assert complete(server, MODEL_ID, keep_alive=0).status_code == 200
    wait_for(lambda: states(server)[MODEL_ID] == "unloaded", 60, "keep_alive 0 to unload the model")
    before = rss_anon_kib(server)
    answer = complete(server, MODEL_ID, keep_alive="2s")
    assert answer.status_code == 200, answer.text
    loaded = rss_anon_kib(server)
    assert states(server)[MODEL_ID] == "loaded"
    wait_for(lambda: states(server)[MODEL_ID] == "unloaded", 60, "the model to unload after its keep-alive")
    unloaded = rss_anon_kib(server)
    print(f"RssAnon: {before} KiB before, {loaded} KiB loaded, {unloaded} KiB unloaded")
    assert loaded - before > 50 * 1024  # its buffers were allocated...
    assert loaded - unloaded > (loaded - before) * 0.8  # ...and returned
    samples = scrape(server)
    assert metric(samples, "edge_llm_model_unloads_total", model=MODEL_ID, reason="keep_alive") == 1
    assert metric(samples, "edge_llm_model_unloads_total", model=MODEL_ID, reason="idle") == 1


def test_the_budget_refuses_with_a_503_naming_the_busy_model_and_recovers_when_it_is_idle(serve: Any) -> None:
    # Each model's estimate at 2,048 tokens is ~0.9 GiB: one fits in 1.5 GiB, both do not.
    server = serve("--memory-budget", "1500MiB", "--load-wait-timeout", "1")
    body = {"model": MODEL_ID, "prompt": "Count from 1 to 1000:", "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=300) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert '"text"' in first, first  # a token, not an error event: generating, so the model is busy
        wait_for(lambda: in_flight(server, MODEL_ID) == 1, 60, "the stream's lease on its model")
        refused = complete(server, GEMMA)
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "5"
    error = refused.json()["error"]
    assert error["code"] == "model_memory_busy"
    assert MODEL_ID in error["message"] and "in flight" in error["message"]
    wait_for(lambda: in_flight(server, MODEL_ID) == 0, 60, "the closed stream to end on the server")
    recovered = complete(server, GEMMA)  # qwen is idle now: evicted for gemma
    assert recovered.status_code == 200, recovered.text
    assert states(server) == {MODEL_ID: "unloaded", GEMMA_ID: "loaded"}
    assert metric(scrape(server), "edge_llm_model_unloads_total", model=MODEL_ID, reason="evicted") == 1


def test_a_request_arriving_during_the_load_waits_for_it_and_succeeds(serve: Any) -> None:
    server = serve()
    results: list[httpx.Response] = []
    first = threading.Thread(target=lambda: results.append(complete(server, GEMMA)))
    first.start()
    wait_for(lambda: states(server)[GEMMA_ID] != "unloaded", 60, "the load to start")
    assert states(server)[GEMMA_ID] == "loading", "the model loaded before a second request could arrive"
    second = complete(server, GEMMA_ID)
    first.join()
    for response in (results[0], second):
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] and response.json()["timings"]["load_ms"] > 0
    assert metric(scrape(server), "edge_llm_model_loads_total", model=GEMMA_ID) == 1  # one shared load
