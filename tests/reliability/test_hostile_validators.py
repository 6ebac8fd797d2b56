"""Every validator applied to request values, fed about a megabyte of its worst case (issue 41), while /healthz is
asked again and again: the event loop answers it within 100 ms the whole time, because the hostile work is
linear-fast or off the event loop (the tokenizer threads). The one timed bound the issue asks for; it is robust to
a scheduling hiccup (a case over the bound is tried up to twice more; work that blocks the loop blocks it every time).
Beside each case, and beside a megabyte prompt on every endpoint family, a neighbour's 2-token request completes
within the suite's neighbour bound (tests/reliability/support.py).

Not here, because they do not meet the bound yet (docs/reliability.md, known gaps): a megabyte of one JSON
object with 100,000 small members (logit_bias with 100,000 keys, 40,000 unknown keys, a schema with 20,000
properties) costs the event loop 0.2-0.6 s on this shared machine, linearly: json.loads, pydantic and the
unknown-key walk all run there and hold the GIL.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.reliability.support import (
    CHAT,
    COMPLETIONS,
    TIMEOUT,
    assert_no_unhandled_errors,
    assert_serving,
    neighbour_alone,
    neighbour_beside,
    rss_anon_kib,
)

MIB = 1 << 20
HEALTHZ_BOUND = 0.100  # seconds
RSS_BOUND_MIB = 48  # RssAnon growth over three more rounds of every case (allocator noise, not a leak per round)


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# Each case: a body of about a megabyte (bytes), the worst case of one validator.
CASES: dict[str, bytes] = {
    "keep_alive: digits then a letter": json.dumps(chat(keep_alive="1" * MIB + "x")).encode(),
    "schema pattern: a{1, then spaces": json.dumps(chat(response_format=schema_format(
        {"type": "string", "pattern": "^a{1," + " " * MIB}))).encode(),
    "grammar: nested groups": json.dumps(chat(grammar="root ::= " + "(" * (MIB // 2) + ")" * (MIB // 2))).encode(),
    "grammar: a megabyte of alternatives": json.dumps(chat(grammar="root ::= " + ' | "a"' * (MIB // 6))).encode(),
    "lone surrogates": b'{"messages": [{"role": "user", "content": "' + b"\\ud800" * (MIB // 6) + b'"}]}',
    "nested arrays": b'{"messages": ' + b"[" * MIB + b"]" * MIB + b"}",
    "a megabyte prompt": json.dumps(chat(messages=[{"role": "user", "content": "hello " * (MIB // 6)}])).encode(),
    "stop: long strings": json.dumps(chat(stop=["ab" * (MIB // 8)] * 4)).encode(),
}


TIMED = list(CASES)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("validators"), "--parallel", "2", "--ctx-size", "2048",
                    "--max-body-bytes", str(8 * MIB)) as running:
        yield running
        assert_serving(running)
        assert_no_unhandled_errors(running)


@pytest.fixture(scope="module")
def alone(server: RunningServer) -> float:
    return neighbour_alone(server)


@pytest.fixture(scope="module")
def model_id(server: RunningServer) -> str:
    return str(httpx.get(server.url + "/v1/models", timeout=TIMEOUT).json()["data"][0]["id"])


def send(server: RunningServer, body: bytes) -> httpx.Response:
    return httpx.post(server.url + CHAT, content=body, timeout=TIMEOUT, headers={"content-type": "application/json"})


def worst_probe(server: RunningServer, body: bytes) -> tuple[float, int, int]:
    """Sends `body` and asks /healthz again and again until it is answered: (the slowest /healthz round trip, how
    many were made, the hostile request's status)."""
    answers: list[httpx.Response] = []

    def hostile() -> None:
        answers.append(send(server, body))

    probes: list[float] = []
    with httpx.Client(timeout=TIMEOUT) as client:
        client.get(server.url + "/healthz")  # the connection is open before the hostile request starts
        thread = threading.Thread(target=hostile)
        thread.start()
        while thread.is_alive() or not probes:
            started = time.perf_counter()
            assert client.get(server.url + "/healthz").status_code == 200
            probes.append(time.perf_counter() - started)
        thread.join(TIMEOUT)
    assert answers, "no answer"
    assert answers[0].status_code in (200, 400, 413), (answers[0].status_code, answers[0].text[:300])
    return max(probes), len(probes), answers[0].status_code


@pytest.mark.parametrize("case", TIMED, ids=TIMED)
def test_healthz_answers_within_100_ms_while_a_megabyte_is_validated(server: RunningServer, case: str) -> None:
    body = CASES[case]
    assert len(body) > MIB // 2
    # More tries only for a scheduling hiccup of the shared machine: work that blocks the event loop blocks it
    # in every one.
    tries = [worst_probe(server, body)]
    while tries[-1][0] > HEALTHZ_BOUND and len(tries) < 3:
        tries.append(worst_probe(server, body))
    worst, probes, status = min(tries)
    assert worst <= HEALTHZ_BOUND, f"{case}: /healthz took {worst * 1000:.0f} ms while it was validated " \
        f"({probes} probes; answer {status}; tries {[(round(t[0] * 1000), t[1]) for t in tries]})"


def test_memory_stays_flat_over_megabyte_requests(server: RunningServer) -> None:
    pid = server.process.pid
    for body in CASES.values():  # warm: the first round sizes the allocator's arenas
        send(server, body)
    start = rss_anon_kib(pid)
    for _ in range(3):
        for body in CASES.values():
            assert send(server, body).status_code in (200, 400, 413)
    growth = (rss_anon_kib(pid) - start) / 1024
    assert growth < RSS_BOUND_MIB, f"RssAnon grew {growth:.1f} MiB over {3 * len(CASES)} megabyte requests"


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_neighbour_goes_on_beside_each_megabyte_case(server: RunningServer, alone: float, case: str) -> None:
    response = neighbour_beside(server, CHAT, CASES[case], alone, case)
    assert response.status_code in (200, 400, 413), (response.status_code, response.text[:300])


MEGABYTE_TEXT = "hello " * (MIB // 6)


def megabyte_prompts(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """A megabyte prompt on each endpoint family: (path, body)."""
    message = [{"role": "user", "content": MEGABYTE_TEXT}]
    return {
        "chat": (CHAT, {"messages": message, "max_tokens": 1}),
        "completions": (COMPLETIONS, {"prompt": MEGABYTE_TEXT, "max_tokens": 1}),
        "messages": ("/v1/messages", {"model": model, "messages": message, "max_tokens": 1}),
        "ollama chat": ("/api/chat", {"model": model, "messages": message, "stream": False}),
        "ollama generate": ("/api/generate", {"model": model, "prompt": MEGABYTE_TEXT, "stream": False}),
        "llama-server completion": ("/completion", {"prompt": MEGABYTE_TEXT, "n_predict": 1}),
    }


FAMILIES = list(megabyte_prompts("m"))


def error_message(path: str, body: dict[str, Any]) -> str:
    """The message of any of the server's error envelopes (OpenAI's, Anthropic's, Ollama's)."""
    error = body["error"]
    return error if isinstance(error, str) else error["message"]


@pytest.mark.parametrize("family", FAMILIES, ids=FAMILIES)
def test_a_megabyte_prompt_that_cannot_fit_is_refused_before_tokenizing(server: RunningServer, alone: float,
                                                                       model_id: str, family: str) -> None:
    """1 MiB cannot be fewer than 1 MiB / (the longest token's bytes) tokens, more than the context: refused
    without spending seconds of the tokenizer on it; the neighbour does not wait."""
    path, body = megabyte_prompts(model_id)[family]
    response = neighbour_beside(server, path, json.dumps(body).encode(), alone, family)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    message = error_message(path, response.json())
    assert "the prompt has at least" in message and "no token of this model is longer than" in message, message
    if not path.startswith("/api/"):
        assert "context_length_exceeded" in response.text, response.text[:300]


def small_tokenize_seconds(server: RunningServer) -> float:
    """A neighbour that needs only the tokenizer thread: /tokenize of one word."""
    started = time.perf_counter()
    response = httpx.post(server.url + "/tokenize", json={"content": "Hello"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def test_a_megabyte_tokenized_in_the_bulk_thread_leaves_the_tokenizer_thread_to_the_others(
        server: RunningServer) -> None:
    """Long text that is legitimately tokenized (/tokenize counts anything) takes seconds: it runs in the bulk
    thread, and a neighbour's tokenizing goes on meanwhile (with one shared thread it waited for all of it: 28 s
    beside 7 MiB). The neighbour here needs the tokenizer thread only, so what is measured is that wait, not how
    a generation shares two cores with a busy thread (the bulk thread runs at a lower priority for that)."""
    small_tokenize_seconds(server)
    alone = statistics.median(small_tokenize_seconds(server) for _ in range(5))
    text = " " * (5 * MIB)  # a run of spaces: among the slowest texts per byte here (~1.6 us/B: 8 s on an idle core)
    response = neighbour_beside(server, "/tokenize", json.dumps({"content": text}).encode(), alone,
                                "5 MiB to /tokenize", neighbour=small_tokenize_seconds)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["tokens"]) >= 5 * MIB // 128
