"""Continuous batching, chunked prefill, prefix caching and cancellation under concurrency.

The chunked-prefill test runs on the small model (tests/helpers.py small_model): it measures when chunks arrive, not
what they say, and its stream runs to max_tokens. The others read the answers (a repeated word, agreement up to
near-ties of the top log-probabilities, which the small model's flat distributions would loosen): default model."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import SMALL_MODEL_CHAT, agreeing_tokens, small_model

CHAT = "/v1/chat/completions"
WORDS = ["pineapple", "volcano", "saxophone", "glacier", "cathedral", "kangaroo", "telescope", "lighthouse"]
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: when the user asks about topic number {i}, answer politely, cite the handbook section {i}, "
    f"and never reveal internal codes." for i in range(1, 36)
)

BATCH_FLAGS = ("--parallel", "8", "--batch-size", "256")


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("batch"), *BATCH_FLAGS) as running:
        yield running


@pytest.fixture(scope="module")
def small_batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("small-batch"), *BATCH_FLAGS, *SMALL_MODEL_CHAT,
                    model=small_model()) as running:
        yield running


def stream_chat(url: str, body: dict[str, Any], started: threading.Event | None = None,
                leave: threading.Event | None = None) -> dict[str, Any]:
    """Streams one chat request; returns text, finish reason, usage, arrival times of content chunks and their
    logprobs entries (when asked for). `started` is set when the first content chunk has arrived; once `leave` is
    set the client hangs up at its next content chunk."""
    text: list[str] = []
    arrivals: list[float] = []
    logprobs: list[dict[str, Any]] = []
    finish = None
    usage = None
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + CHAT, json=payload, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    text.append(choice["delta"]["content"])
                    arrivals.append(time.monotonic())
                    if started is not None:
                        started.set()
                logprobs += (choice.get("logprobs") or {}).get("content") or []
                finish = choice["finish_reason"] or finish
            if leave is not None and leave.is_set() and text:
                break
    return {"text": "".join(text), "finish_reason": finish, "usage": usage, "arrivals": arrivals,
            "logprobs": logprobs}


def test_eight_concurrent_streams_complete_without_cross_talk(batch_server: RunningServer) -> None:
    def ask(word: str) -> dict[str, Any]:
        return stream_chat(batch_server.url, {
            "messages": [{"role": "user", "content": f"Repeat the word '{word}' exactly five times, "
                                                     "separated by spaces, and nothing else."}],
            "temperature": 0, "max_tokens": 24,
        })

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = dict(zip(WORDS, pool.map(ask, WORDS)))
    for word, result in results.items():
        assert result["finish_reason"] in ("stop", "length")
        assert word in result["text"].lower(), (word, result["text"])
        others = [w for w in WORDS if w != word and w in result["text"].lower()]
        assert not others, (word, result["text"])
        usage = result["usage"]
        assert usage["completion_tokens"] >= len(result["arrivals"]) > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_long_prompt_is_prefilled_in_chunks_without_freezing_running_streams(
        small_batch_server: RunningServer) -> None:
    running: dict[str, Any] = {}
    decoding, answered = threading.Event(), threading.Event()

    def long_stream() -> None:  # 200 tokens outlast the prefill; it leaves at its first chunk after the answer
        running.update(stream_chat(small_batch_server.url, {
            "messages": [{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
            "temperature": 0, "max_tokens": 200,
        }, started=decoding, leave=answered))

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert decoding.wait(120), "the running stream never produced a token"
    essay = " ".join(f"Paragraph {i} talks about rivers, mountains and the weather in spring." for i in range(220))
    sent_at = time.monotonic()
    big = httpx.post(small_batch_server.url + CHAT, json={
        "messages": [{"role": "user", "content": essay + "\nSummarize in one line."}],
        "temperature": 0, "max_tokens": 4,
    }, timeout=300).json()
    answered_at = time.monotonic()
    answered.set()
    thread.join(300)
    prompt_tokens = big["usage"]["prompt_tokens"]
    prefill_seconds = big["timings"]["prefill_ms"] / 1000
    assert prompt_tokens > 3000  # twelve chunks of 256
    gaps_during_prefill = [
        later - earlier
        for earlier, later in zip(running["arrivals"], running["arrivals"][1:])
        if later > sent_at and earlier < sent_at + prefill_seconds
    ]
    assert gaps_during_prefill, "the running stream produced nothing while the long prompt was prefilled"
    # Without chunking the running stream would stall for the whole prefill; with it, at most ~one chunk.
    assert max(gaps_during_prefill) < 0.5 * prefill_seconds, (max(gaps_during_prefill), prefill_seconds)
    # It went on after the long prompt's answer (then its client left), not ended or broken by the prefill.
    assert running["finish_reason"] is None and running["arrivals"][-1] > answered_at, running


def test_shared_prefix_is_reused_and_gives_the_same_answer_up_to_rounding(batch_server: RunningServer) -> None:
    def ask(question: str) -> dict[str, Any]:
        response = httpx.post(batch_server.url + CHAT, json={
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 24, "logprobs": True, "top_logprobs": 5,
        }, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()

    cold = ask("What does rule 7 say?")
    warm = ask("What does rule 7 say?")
    other = ask("What does rule 12 say?")
    cold_usage, warm_usage, other_usage = cold["usage"], warm["usage"], other["usage"]
    assert cold_usage["prompt_tokens"] > 700
    assert cold_usage["prompt_tokens_details"]["cached_tokens"] < 50  # nothing of this prompt was cached
    assert warm_usage["prompt_tokens_details"]["cached_tokens"] == warm_usage["prompt_tokens"] - 1
    assert other_usage["prompt_tokens_details"]["cached_tokens"] > 700
    # The reused KV was computed in another batch layout, so the warm answer is the cold one up to rounding
    # (not byte for byte): the same tokens with the same log-probabilities until, if ever, a near-tie.
    agreeing_tokens(cold["choices"][0]["logprobs"]["content"], warm["choices"][0]["logprobs"]["content"])
    assert warm["timings"]["prefill_ms"] < cold["timings"]["prefill_ms"]


def test_conversation_turns_reuse_the_previous_turn(batch_server: RunningServer) -> None:
    history = [{"role": "user", "content": "Give me a name for a pet turtle."}]
    first = httpx.post(batch_server.url + CHAT, json={"messages": history, "temperature": 0, "max_tokens": 16},
                       timeout=300).json()
    history += [first["choices"][0]["message"], {"role": "user", "content": "Why that name?"}]
    second = httpx.post(batch_server.url + CHAT, json={"messages": history, "temperature": 0, "max_tokens": 16},
                        timeout=300).json()
    reused = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert reused >= first["usage"]["prompt_tokens"]


def test_cancelling_one_stream_leaves_the_others_intact(batch_server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "List the numbers from 1 to 100."}],
            "temperature": 0, "max_tokens": 40, "logprobs": True, "top_logprobs": 5}

    def cancel_early() -> int:
        seen = 0
        with httpx.stream("POST", batch_server.url + CHAT, json={**body, "stream": True}, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 3:
                        return seen
        return seen

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        full = [pool.submit(stream_chat, batch_server.url, body) for _ in range(3)]
        cancelled = pool.submit(cancel_early)
        results = [f.result() for f in full]
    assert cancelled.result() == 3
    # Batch mates and the prefix cache change rounding, not the answer: the three full streams agree up to it.
    for other in results[1:]:
        agreeing_tokens(results[0]["logprobs"], other["logprobs"])
    for result in results:
        assert result["finish_reason"] == "length"
        assert result["usage"]["completion_tokens"] == 40
