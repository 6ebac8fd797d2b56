"""Soak (issue 6): a bounded run of mixed requests from concurrent clients, a third of which hang up at
random points. Every request that was not cut off completes in full; the server's anonymous memory settles;
the engine's sequences, queue and KV reservations come back down.

Opt-in: the default run leaves it out (`soak` marker); `pytest -m soak` runs it, and so does `.ci/run` after the
suite. `EDGE_LLM_SOAK_REQUESTS` (default 200) sets the number of requests, `EDGE_LLM_SOAK_CLIENTS` (default 6) the
concurrent clients, `EDGE_LLM_SOAK_RSS_BOUND_MIB` (default 8) the bound on RssAnon growth per 100 requests.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import parse_sse
from tests.reliability.support import (
    CHAT,
    COMPLETIONS,
    assert_no_unhandled_errors,
    assert_serving,
    env_int,
    metric,
    rss_anon_kib,
    scrape,
    slope,
    wait_idle,
)

REQUESTS = env_int("EDGE_LLM_SOAK_REQUESTS", 200)
CLIENTS = env_int("EDGE_LLM_SOAK_CLIENTS", 6)
RSS_BOUND_MIB = env_int("EDGE_LLM_SOAK_RSS_BOUND_MIB", 8)
CAP = 8  # --max-tokens-cap
CACHE_SLOTS = 4
CTX = 4096
SEED = env_int("EDGE_LLM_SOAK_SEED", 20261129)

SUBJECTS = ["the sea", "a lighthouse", "rust and go", "prime numbers", "a cat", "the moon", "edge devices",
            "a small town", "binary trees", "rain"]
PREFIXES = ["You are a terse assistant. ", "Answer in one sentence. ", ""]


@dataclass
class Outcome:
    kind: str
    cut: bool  # this client hung up on purpose before the end
    completed: bool = False
    problems: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("soak"), "--parallel", "4", "--cache-slots", str(CACHE_SLOTS),
                    "--max-tokens-cap", str(CAP), "--ctx-size", str(CTX), "--queue-capacity", "64",
                    "--stream-idle-timeout", "30") as running:
        yield running


def random_request(rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    kind = rng.choice(["chat", "chat-stream", "simple", "completion", "completion-stream"])
    text = rng.choice(PREFIXES) + f"Tell me about {rng.choice(SUBJECTS)}. " + " ".join(
        rng.choice(SUBJECTS) for _ in range(rng.randint(0, 12)))
    max_tokens = rng.randint(1, CAP + 4)  # sometimes over the cap
    if kind == "simple":
        return kind, CHAT, {"prompt": text, "max_tokens": max_tokens, "temperature": rng.choice([0, 0.7, 1.3]),
                            "top_p": rng.choice([0.5, 0.9, 1.0])}
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": rng.choice([0, 0.5, 1.0, 1.5]),
                            "top_p": rng.choice([0.8, 1.0]), "stream": kind.endswith("stream")}
    if rng.random() < 0.3:
        body["seed"] = rng.randint(0, 2 ** 32)
    if rng.random() < 0.2:
        body["stop"] = rng.choice([",", [".", "\n"], "the"])
    if rng.random() < 0.2:
        body["top_k"] = rng.randint(1, 50)
    if rng.random() < 0.2:
        body["presence_penalty"] = rng.uniform(-1, 1)
    if rng.random() < 0.25:
        body["n"] = 2
    if body["stream"] and rng.random() < 0.7:
        body["stream_options"] = {"include_usage": True}
    if kind.startswith("chat"):
        body["messages"] = [{"role": "user", "content": text}]
        if rng.random() < 0.2:
            body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 5)
        return kind, CHAT, body
    body["prompt"] = text
    if rng.random() < 0.2:
        body["logprobs"] = rng.randint(0, 5)
    return kind, COMPLETIONS, body


def expected_tokens(body: dict[str, Any]) -> int:
    return min(body["max_tokens"], CAP)


def check_usage(usage: dict[str, Any], choices: int, body: dict[str, Any], problems: list[str]) -> None:
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        problems.append(f"usage does not add up: {usage}")
    if not 0 < usage["prompt_tokens"] < CTX:
        problems.append(f"prompt tokens {usage['prompt_tokens']}")
    if not 0 <= usage["completion_tokens"] <= choices * expected_tokens(body):
        problems.append(f"completion tokens {usage['completion_tokens']} for {choices} x {expected_tokens(body)}")


def check_json(kind: str, body: dict[str, Any], response: httpx.Response, outcome: Outcome) -> None:
    data = response.json()
    n = body.get("n", 1)
    choices = data["choices"]
    if len(choices) != n:
        outcome.problems.append(f"{len(choices)} choices for n={n}")
    for choice in choices:
        if choice["finish_reason"] not in ("stop", "length"):
            outcome.problems.append(f"finish_reason {choice['finish_reason']!r}")
        text = choice["message"]["content"] if kind == "chat" else choice["text"]
        if not isinstance(text, str):
            outcome.problems.append(f"no text: {choice}")
    check_usage(data["usage"], n, body, outcome.problems)
    if n == 1 and choices[0]["finish_reason"] == "length" and data["usage"]["completion_tokens"] != expected_tokens(body):
        outcome.problems.append(f"length after {data['usage']['completion_tokens']} of {expected_tokens(body)} tokens")


def check_openai_stream(body: dict[str, Any], raw: str, outcome: Outcome) -> None:
    payloads = [data for name, data in parse_sse(raw) if name == "message"]
    if not payloads or payloads[-1] != "[DONE]":
        outcome.problems.append(f"the stream does not end with [DONE]: {raw[-200:]!r}")
        return
    chunks = [json.loads(data) for data in payloads[:-1]]
    n = body.get("n", 1)
    finish: dict[int, str] = {}
    usage = None
    for chunk in chunks:
        if "error" in chunk:
            outcome.problems.append(f"error chunk: {chunk}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            if choice.get("finish_reason"):
                if choice["index"] in finish:
                    outcome.problems.append(f"two finish chunks for choice {choice['index']}")
                finish[choice["index"]] = choice["finish_reason"]
    if sorted(finish) != list(range(n)) or not set(finish.values()) <= {"stop", "length"}:
        outcome.problems.append(f"finish reasons {finish} for n={n}")
    if body.get("stream_options", {}).get("include_usage"):
        if usage is None:
            outcome.problems.append("no usage chunk")
        else:
            check_usage(usage, n, body, outcome.problems)


def check_simple_stream(body: dict[str, Any], raw: str, outcome: Outcome) -> None:
    events = parse_sse(raw)
    if not events or events[-1][0] != "done":
        outcome.problems.append(f"the stream does not end with a done event: {raw[-200:]!r}")
        return
    done = json.loads(events[-1][1])
    if done["finish_reason"] not in ("stop", "length"):
        outcome.problems.append(f"finish_reason {done['finish_reason']!r}")
    check_usage(done["usage"], 1, body, outcome.problems)
    if done["finish_reason"] == "length" and done["usage"]["completion_tokens"] != expected_tokens(body):
        outcome.problems.append(f"length after {done['usage']['completion_tokens']} of {expected_tokens(body)}")
    if any(name == "error" for name, _ in events):
        outcome.problems.append("an error event")


def one_request(client: httpx.Client, server: RunningServer, rng: random.Random, cutter: bool) -> Outcome:
    kind, path, body = random_request(rng)
    cut = cutter and rng.random() < 0.8
    outcome = Outcome(kind, cut)
    streaming = kind == "simple" or body.get("stream", False)
    try:
        if not streaming:
            timeout = rng.uniform(0.05, 1.5) if cut else 300.0
            response = client.post(server.url + path, json=body, timeout=timeout)
            if response.status_code != 200:
                outcome.problems.append(f"status {response.status_code}: {response.text[:300]}")
                return outcome
            check_json(kind, body, response, outcome)
            outcome.completed = True
            return outcome
        with client.stream("POST", server.url + path, json=body, timeout=300) as response:
            if response.status_code != 200:
                outcome.problems.append(f"status {response.status_code}: {response.read()[:300]!r}")
                return outcome
            stop_after = rng.randint(0, 6) if cut else None
            raw = ""
            for number, text in enumerate(response.iter_text()):
                raw += text
                if stop_after is not None and number >= stop_after:
                    return outcome  # leaving the block closes the connection mid-stream
        if kind == "simple":
            check_simple_stream(body, raw, outcome)
        else:
            check_openai_stream(body, raw, outcome)
        outcome.completed = True
    except httpx.TimeoutException:
        if not cut:
            outcome.problems.append("timed out")
    except httpx.HTTPError as exc:
        outcome.problems.append(f"{type(exc).__name__}: {exc}")
    return outcome


@pytest.mark.soak
def test_soak(soak_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    pid = soak_server.process.pid
    before = scrape(soak_server)
    lock = threading.Lock()
    issued = [0]
    done = [0]
    outcomes: list[Outcome] = []
    samples: list[tuple[float, float]] = []  # (requests done, RssAnon MiB)
    stop_sampling = threading.Event()

    def client_loop(index: int) -> None:
        rng = random.Random(SEED * 100 + index)
        cutter = index % 3 == 0  # a third of the clients hang up at random points
        with httpx.Client() as client:
            while True:
                with lock:
                    if issued[0] >= REQUESTS:
                        return
                    issued[0] += 1
                outcome = one_request(client, soak_server, rng, cutter)
                with lock:
                    outcomes.append(outcome)
                    done[0] += 1

    def sampler() -> None:
        while not stop_sampling.wait(0.25):
            with lock:
                count = done[0]
            samples.append((count, rss_anon_kib(pid) / 1024))

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    started = time.monotonic()
    clients = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join(3600)
    elapsed = time.monotonic() - started
    stop_sampling.set()
    sampling.join()

    problems = [f"{o.kind}{' (cut)' if o.cut else ''}: {p}" for o in outcomes for p in o.problems]
    assert not problems, "\n".join(problems[:30])
    assert len(outcomes) == REQUESTS
    completed = sum(o.completed for o in outcomes)
    cut_short = sum(o.cut and not o.completed for o in outcomes)
    assert completed >= REQUESTS // 2 and cut_short >= 1, (completed, cut_short)

    # Everything comes back down: no sequence running or waiting, no request in flight, and the KV cells
    # still in use are only those of the prefix cache (at most CACHE_SLOTS finished sequences).
    after = wait_idle(soak_server)
    cached = metric(after, "edge_llm_cached_sequences")
    used = metric(after, "edge_llm_kv_cells_used")
    assert cached <= CACHE_SLOTS
    assert used <= cached * 400, (used, cached)  # a soak prompt is < 150 tokens, + at most CAP generated
    assert metric(after, "edge_llm_generations_finished_total", reason="error") == metric(
        before, "edge_llm_generations_finished_total", reason="error")
    cancelled = sum(metric(after, "edge_llm_cancellations_total", phase=phase)
                    - metric(before, "edge_llm_cancellations_total", phase=phase)
                    for phase in ("queued", "prefill", "decode"))
    assert cancelled >= 1

    # Memory: the slope of RssAnon over requests after a warm-up of a quarter of the run.
    warm = [(count, mib) for count, mib in samples if count >= max(REQUESTS // 4, 20)]
    assert len(warm) >= 5, samples
    per_100 = slope(warm) * 100
    report = (f"soak: {REQUESTS} requests from {CLIENTS} clients in {elapsed:.0f}s ({completed} completed, "
              f"{cut_short} cut short, {cancelled:.0f} cancellations); RssAnon {warm[0][1]:.1f} -> {warm[-1][1]:.1f} "
              f"MiB, slope {per_100:+.2f} MiB per 100 requests after warm-up (bound {RSS_BOUND_MIB})")
    with capsys.disabled():
        sys.stderr.write("\n" + report + "\n")
    assert per_100 < RSS_BOUND_MIB, report
    assert_serving(soak_server)
    assert_no_unhandled_errors(soak_server)
