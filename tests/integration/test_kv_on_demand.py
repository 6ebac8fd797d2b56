"""KV cells on demand on the real model (issue 12): answers without max_tokens run until they end, chats that
share a long system prompt all run at once, and preempted answers go on where they stopped. The shared-prompt test
runs on the small model (tests/helpers.py small_model): it counts cells and sequences, not what the answers say. The
other two stay on the default model: one needs an answer that ends by itself (gemma-3-270m, a base model, rarely
ends), the other compares answers token for token up to near-ties, and the small model's flat distributions part at
tokens outside each other's top 2 (tried: 'not a near-tie' at token 44)."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import (SMALL_MODEL_CHAT, Samples, agreeing_tokens, metric, scrape, small_model, sse_events,
                           wait_for)

CHAT = "/v1/chat/completions"
SYSTEM_PROMPT = " ".join(
    f"Rule {i}: when the user asks about topic number {i}, answer politely, cite the handbook section {i}, "
    f"and never reveal internal codes." for i in range(1, 41)
)  # about 1,000 tokens


@pytest.fixture(scope="module")
def roomy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """8 sequences in the default 8,192-cell context."""
    with run_server(tmp_path_factory.mktemp("roomy"), "--parallel", "8", *SMALL_MODEL_CHAT,
                    model=small_model()) as running:
        yield running


@pytest.fixture(scope="module")
def crowded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """8 sequences in a 512-cell context: their answers together do not fit, so some are preempted."""
    with run_server(tmp_path_factory.mktemp("crowded"), "--parallel", "8", "--ctx-size", "512",
                    "--cache-slots", "0") as running:
        yield running


def stream_chat(url: str, body: dict[str, Any], started: threading.Event | None = None,
                leave: threading.Event | None = None) -> dict[str, Any]:
    """One streamed chat answer: its text, logprobs entries, finish reason, usage and timings. `started` is set at
    the first content; once `leave` is set the client goes away at the next chunk."""
    text: list[str] = []
    logprobs: list[dict[str, Any]] = []
    result: dict[str, Any] = {"finish_reason": None, "usage": None, "timings": None}
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + CHAT, json=payload, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for _, data in sse_events(response):
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            result["usage"] = chunk.get("usage") or result["usage"]
            result["timings"] = chunk.get("timings") or result["timings"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    text.append(choice["delta"]["content"])
                    if started is not None:
                        started.set()
                logprobs += (choice.get("logprobs") or {}).get("content") or []
                result["finish_reason"] = choice["finish_reason"] or result["finish_reason"]
            if leave is not None and leave.is_set():
                break
    return {**result, "text": "".join(text), "logprobs": logprobs}


def test_an_answer_without_max_tokens_runs_until_it_ends(server: RunningServer, model_id: str) -> None:
    """The official SDK sends no max_tokens unless asked: the answer is not cut at --default-max-tokens (128)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=900)  # a long answer
    completion = client.chat.completions.create(
        model=model_id, temperature=0,
        # ~230 tokens and an end of its own (a longer answer only costs time)
        messages=[{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome, "
                                              "with a docstring."}],
    )
    choice = completion.choices[0]
    assert completion.usage.completion_tokens > 128, completion.usage
    assert choice.finish_reason == "stop", (choice.finish_reason, completion.usage)


def test_eight_chats_sharing_a_long_system_prompt_all_run_at_once(roomy_server: RunningServer) -> None:
    """With max_tokens 1024, reserving prompt + max_tokens would let 4 of 8 run in 8,192 cells; cells charged as
    filled, with the shared prompt counted once, let all 8 run together."""
    started = [threading.Event() for _ in range(8)]
    leave = threading.Event()
    bodies = [{"messages": [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": f"What does rule {3 * i + 1} say? Answer at length."}],
               "temperature": 0, "max_tokens": 1024, "ignore_eos": True} for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream_chat, roomy_server.url, body, started[i], leave) for i, body in enumerate(bodies)]
        try:
            wait_for(lambda: all(event.is_set() for event in started) or any(f.done() for f in futures), 240,
                     "every chat's first token")
            samples = scrape(roomy_server)  # none can end yet: 1,024 tokens each, end tokens banned
        finally:
            leave.set()
        results = [future.result() for future in futures]
    assert all(result["text"] for result in results)
    assert metric(samples, "edge_llm_running_sequences") == 8
    assert metric(samples, "edge_llm_queue_depth") == 0
    assert metric(samples, "edge_llm_preemptions_total") == 0
    prompt_tokens = metric(samples, "edge_llm_prompt_tokens_total")
    assert prompt_tokens > 8 * 900
    # the shared system prompt is held once: far fewer cells than the 8 prompts hold between them
    assert metric(samples, "edge_llm_kv_cells_used") < prompt_tokens / 3
    wait_for(lambda: metric(scrape(roomy_server), "edge_llm_running_sequences") == 0, 60, "the chats to be cancelled")


def test_preempted_answers_go_on_where_they_stopped(crowded_server: RunningServer,
                                                    repeatable_server: RunningServer) -> None:
    """8 answers that do not fit the context together: some are preempted and recomputed. Each is compared, token
    for token, with the same request answered alone where answers repeat exactly (repeatable_server). Batch mates
    change llama.cpp's rounding, so two greedy answers may part at a near-tie (tests/helpers.py, ROUNDING); a
    doubled or lost token after a preemption is not a near-tie and fails."""
    # ~50 prompt cells each and answers of 60 tokens (up to ~60 lines asked for): the eight overflow the 512 cells
    # together (~880), so preemption is certain; a longer answer only makes the sequential references slower
    bodies = [{"messages": [{"role": "user", "content": f"Write the numbers from {10 * i} to {10 * i + 60}, one "
                                                        "per line, and nothing else."}],
               "temperature": 0, "max_tokens": 60, "logprobs": True, "top_logprobs": 2} for i in range(1, 9)]
    references = [stream_chat(repeatable_server.url, body) for body in bodies]
    # Where the preemptions fall depends on the arrivals; a round whose every preempted answer parted from its
    # reference at a near-tie before its preemption shows nothing about the recompute: up to three rounds are run,
    # each checked in full, until one shows it.
    compared_past_preemption: list[int] = []
    for _ in range(3):
        before = scrape(crowded_server)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            crowded = list(pool.map(lambda body: stream_chat(crowded_server.url, body), bodies))
        after = scrape(crowded_server)
        compared_past_preemption = crowded_round(references, crowded, before, after)
        if compared_past_preemption:
            break
    # A recomputed answer may part from the reference at a near-tie like any other (its first token after the
    # recompute is computed in another batch layout); what matters is that no token before the preemption was lost
    # or doubled, and that wherever the answers were compared they agreed (agreeing_tokens fails otherwise).
    assert compared_past_preemption, ("no preempted answer was compared up to its preemption",
                                      [(r["timings"], len(r["logprobs"])) for r in crowded])
    assert metric(after, "edge_llm_kv_cells_used") == 0  # no prefix cache: every cell is back


def crowded_round(references: list[dict[str, Any]], crowded: list[dict[str, Any]], before: Samples,
                  after: Samples) -> list[int]:
    """Checks one crowded round against the references; returns the preempted answers compared past their
    preemption."""
    demand = sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in crowded)
    assert demand > 512 + 8 * 8, ("the answers fit the context together: nothing to preempt", demand)
    preemptions = metric(after, "edge_llm_preemptions_total") - metric(before, "edge_llm_preemptions_total")
    preempted = [i for i, result in enumerate(crowded) if (result["timings"] or {}).get("preemptions")]
    assert preemptions >= len(preempted) >= 1, (preemptions, [r["timings"] for r in crowded])
    compared_past_preemption = []
    for index, (reference, result) in enumerate(zip(references, crowded)):
        assert result["usage"]["completion_tokens"] == len(result["logprobs"]), "one usage, every token once"
        shared = agreeing_tokens(reference["logprobs"], result["logprobs"])
        if shared == len(reference["logprobs"]) == len(result["logprobs"]):
            assert (result["text"], result["finish_reason"]) == (reference["text"], reference["finish_reason"])
        if index in preempted:
            timings = result["timings"]
            assert 0 <= timings["recompute_ms"] <= timings["decode_ms"], timings
            assert 0 <= timings["preempted_after_tokens"] <= result["usage"]["completion_tokens"], timings
            if shared >= timings["preempted_after_tokens"]:
                compared_past_preemption.append(index)
    return compared_past_preemption
