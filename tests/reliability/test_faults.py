"""Faults (issue 6): the engine thread dies under load, SIGTERM under load, a client process killed
mid-request, the queue at capacity for a sustained period. tests/integration/test_operations.py already
shows the single-stream cases (engine death with one stream, SIGTERM with two streams, a client that
stops reading); these add load, and a client that dies instead of hanging up.

`EDGE_LLM_QUEUE_SECONDS` (default 6) sets how long the queue is kept at capacity.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.fault_server import run_fault_server
from tests.helpers import parse_sse
from tests.reliability.support import (
    CHAT,
    COMPLETIONS,
    TIMEOUT,
    assert_envelope,
    assert_error,
    assert_no_unhandled_errors,
    assert_serving,
    chat_body,
    env_int,
    metric,
    scrape,
    wait_for,
    wait_idle,
)

QUEUE_SECONDS = env_int("EDGE_LLM_QUEUE_SECONDS", 6)
LONG_TASK = "Write the numbers from 1 to 3000, separated by commas."
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a raw completion that goes on counting
# End-of-text and end-of-turn banned: these requests run until they are stopped.
NO_END = {"logit_bias": {"151643": -100, "151645": -100}, "temperature": 0}


class Request:
    """One request on its own thread, read to the end; `first` is set when the first bytes of a body came."""

    def __init__(self, server: RunningServer, path: str, body: dict[str, Any]) -> None:
        self.status = 0
        self.text = ""
        self.headers: dict[str, str] = {}
        self.error: BaseException | None = None
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, path, body), daemon=True)
        self._thread.start()

    def _run(self, server: RunningServer, path: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", server.url + path, json=body, timeout=TIMEOUT) as response:
                self.status = response.status_code
                self.headers = dict(response.headers)
                for text in response.iter_text():
                    self.text += text
                    if "data:" in self.text:
                        self.first.set()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc
        finally:
            self.first.set()

    def join(self, timeout: float = TIMEOUT) -> Request:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request did not end"
        return self

    def events(self) -> list[tuple[str, str]]:
        return parse_sse(self.text)


def openai_chunks(text: str) -> list[Any]:
    return [data if data == "[DONE]" else json.loads(data) for name, data in parse_sse(text) if name == "message"]


# ---- the engine thread dies with requests of every kind in flight ---------------------------------------------------


def test_engine_death_under_load_fails_every_request_and_exits_nonzero(tmp_path: Path) -> None:
    with run_fault_server(tmp_path, "--parallel", "3", "--drain-timeout", "30") as server:
        simple = Request(server, CHAT, {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 2000})
        chat_stream = Request(server, CHAT, chat_body(LONG_TASK, max_tokens=2000, stream=True, **NO_END))
        completion_stream = Request(server, COMPLETIONS, {"prompt": COUNTING, "max_tokens": 2000, "stream": True,
                                                          **NO_END})
        for request in (simple, chat_stream, completion_stream):
            assert request.first.wait(TIMEOUT)
        # Non-streamed, and a stream that waits: the three sequences are busy.
        plain = Request(server, CHAT, chat_body(LONG_TASK, max_tokens=2000, **NO_END))
        queued = Request(server, CHAT, chat_body(LONG_TASK, max_tokens=2000, stream=True, **NO_END))
        wait_for(lambda: metric(scrape(server), "edge_llm_http_requests_in_flight") >= 5, TIMEOUT, "five requests")

        server.process.send_signal(signal.SIGUSR1)  # the next decode step fails as llama.cpp would

        # The simple stream: an error event (the envelope) is its last.
        name, data = simple.join().events()[-1]
        assert name == "error", simple.text[-300:]
        assert json.loads(data)["error"]["code"] == "engine_unavailable"
        # The OpenAI streams: an error chunk in the envelope, then the end marker.
        for stream in (chat_stream, completion_stream, queued):
            chunks = openai_chunks(stream.join().text)
            assert stream.status == 200 and chunks[-1] == "[DONE]", stream.text[-300:]
            errors = [c for c in chunks[:-1] if "error" in c]
            assert len(errors) >= 1, stream.text[-300:]
            assert_envelope(503, json.dumps(errors[0]))
        # The non-streamed request: 503 in the envelope.
        plain.join()
        assert plain.status == 503, plain.text
        assert assert_envelope(503, plain.text)["code"] in ("engine_unavailable", "shutting_down")

        assert server.process.wait(60) == 1
        assert "engine thread died" in server.log()


# ---- SIGTERM with requests running and queued ---------------------------------------------------------------------------


def test_sigterm_under_load_finishes_running_and_queued_refuses_new_and_exits_zero(tmp_path: Path) -> None:
    with run_server(tmp_path, "--parallel", "2", "--drain-timeout", "120", "--log-format", "text") as server:
        count = "Count from 1 to 40, separated by spaces."
        requests = [
            Request(server, CHAT, {"prompt": count, "temperature": 0, "max_tokens": 16}),
            Request(server, CHAT, chat_body(count, max_tokens=16, stream=True)),
            Request(server, COMPLETIONS, {"prompt": COUNTING, "max_tokens": 16, "stream": True}),
            Request(server, CHAT, chat_body(count, max_tokens=16)),
            Request(server, CHAT, chat_body(count, max_tokens=16, n=2)),
        ]

        def all_in_and_one_queued() -> bool:
            # The gate refuses what arrives after SIGTERM: every request must have come in before it.
            metrics = scrape(server)
            return (metric(metrics, "edge_llm_http_requests_in_flight") >= len(requests)
                    and metric(metrics, "edge_llm_queue_depth") >= 1)

        wait_for(all_in_and_one_queued, 60, "five requests in, one of them queued")
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(server.url + "/readyz", timeout=10).status_code == 503, 30, "/readyz 503")
        assert httpx.get(server.url + "/readyz", timeout=10).json() == {"status": "draining"}
        refused = httpx.post(server.url + CHAT, json=chat_body(), timeout=30)
        assert_error(refused, 503, "shutting_down")
        assert int(refused.headers["retry-after"]) > 0
        for request in requests:
            request.join()
            assert request.error is None and request.status == 200, (request.status, request.error, request.text[-300:])
        simple, chat_stream, completion_stream, plain, pair = requests
        assert simple.events()[-1][0] == "done"
        assert json.loads(simple.events()[-1][1])["finish_reason"] in ("stop", "length")
        for stream in (chat_stream, completion_stream):
            chunks = openai_chunks(stream.text)
            assert chunks[-1] == "[DONE]" and not any("error" in c for c in chunks[:-1])
            assert [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]][-1] in ("stop", "length")
        for response in (plain, pair):
            choices = json.loads(response.text)["choices"]
            assert all(c["finish_reason"] in ("stop", "length") for c in choices)
        assert len(json.loads(pair.text)["choices"]) == 2
        assert server.process.wait(60) == 0


# ---- a client process killed mid-request ---------------------------------------------------------------------------------

CLIENT = textwrap.dedent("""
    import sys, threading, httpx
    url, stream = sys.argv[1], sys.argv[2] == "stream"
    body = {"messages": [{"role": "user", "content": %r}], "max_tokens": 3000, "temperature": 0, "stream": stream}
    if stream:
        with httpx.stream("POST", url, json=body, timeout=600) as response:
            chunks = 0
            # Kept referenced: a line iterator that is let go closes the response, and with it the connection.
            lines = response.iter_lines()
            for line in lines:
                chunks += line.startswith("data:")
                if chunks == 3:  # the role chunk, then two tokens
                    print("started", flush=True)
                    break
            threading.Event().wait()  # holds the connection, reading nothing more, until killed
    else:
        print("sending", flush=True)
        httpx.post(url, json=body, timeout=600)
""" % LONG_TASK)


@pytest.fixture(scope="module")
def kill_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("kill"), "--parallel", "2", "--cache-slots", "0") as running:
        yield running


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_sigkill_of_a_client_mid_request_frees_its_sequence(kill_server: RunningServer, stream: bool) -> None:
    wait_idle(kill_server)
    before = scrape(kill_server)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, kill_server.url + CHAT, "stream" if stream else "json"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() in ("started", "sending")  # streamed: a token arrived
        seen: list[float] = []

        def running() -> bool:
            seen.append(metric(scrape(kill_server), "edge_llm_running_sequences"))
            return seen[-1] == 1

        try:
            wait_for(running, TIMEOUT, "the sequence")
        except AssertionError:
            raise AssertionError(f"running sequences seen: {sorted(set(seen))}; server log:\n"
                                 f"{kill_server.log()[-4000:]}") from None
        # Into decoding: two gaps between its tokens observed (the generated-token counter moves only when a
        # generation ends; the inter-token histogram moves with every token).
        gaps = "edge_llm_inter_token_latency_seconds_count"
        wait_for(lambda: metric(scrape(kill_server), gaps) >= metric(before, gaps) + 2, TIMEOUT, "two decoded tokens")
        client.send_signal(signal.SIGKILL)
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    wait_for(lambda: metric(scrape(kill_server), "edge_llm_running_sequences") == 0, 30, "the sequence freed")
    after = wait_idle(kill_server)
    # Cancelled (the client went away), while decoding: a streamed client had two tokens already.
    phases = [p for p in ("queued", "prefill", "decode") if metric(after, "edge_llm_cancellations_total", phase=p)
              != metric(before, "edge_llm_cancellations_total", phase=p)]
    assert phases == ["decode"], phases
    assert metric(after, "edge_llm_generations_finished_total", reason="cancelled") == metric(
        before, "edge_llm_generations_finished_total", reason="cancelled") + 1
    generated = metric(after, "edge_llm_generated_tokens_total") - metric(before, "edge_llm_generated_tokens_total")
    assert generated < 2500  # stopped long before its 3000 tokens
    assert metric(after, "edge_llm_kv_cells_used") == 0  # no prefix cache here: every cell is back
    assert_serving(kill_server)


# ---- the queue at capacity for a sustained period -------------------------------------------------------------------------


def test_queue_at_capacity_for_a_sustained_period(tmp_path: Path) -> None:
    with run_server(tmp_path, "--parallel", "1", "--queue-capacity", "2", "--max-tokens-cap", "6",
                    "--cache-slots", "0") as server:
        before = scrape(server)
        deadline = time.monotonic() + QUEUE_SECONDS
        answered = threading.Condition()  # notified whenever a response comes back: the queue may have moved
        statuses: list[int] = []
        problems: list[str] = []
        readiness: list[tuple[int, str]] = []

        def client(index: int) -> None:
            with httpx.Client(timeout=TIMEOUT) as http:
                while time.monotonic() < deadline:
                    body = chat_body(f"Name a colour ({index}).", max_tokens=6, stream=index % 2 == 0)
                    with answered:
                        accepted_before = statuses.count(200)
                    response = http.post(server.url + CHAT, json=body)
                    problem = None
                    if response.status_code == 503:
                        error = assert_envelope(503, response.content)
                        if error["code"] != "queue_full" or int(response.headers.get("retry-after", "0")) < 1:
                            problem = f"503 without queue_full / Retry-After: {response.headers} {response.text}"
                    elif response.status_code == 200:
                        if body["stream"]:
                            chunks = openai_chunks(response.text)
                            if chunks[-1] != "[DONE]" or any("error" in c for c in chunks[:-1]):
                                problem = f"incomplete stream: {response.text[-300:]}"
                        elif response.json()["choices"][0]["finish_reason"] not in ("stop", "length"):
                            problem = f"incomplete: {response.text}"
                    else:
                        problem = f"status {response.status_code}: {response.text[:300]}"
                    with answered:
                        statuses.append(response.status_code)
                        if problem:
                            problems.append(problem)
                        answered.notify_all()
                        if response.status_code == 503:  # back off until an accepted request has ended since
                            answered.wait_for(lambda: statuses.count(200) > accepted_before, TIMEOUT)

        def prober() -> None:
            """Reads readiness once after each response (when the queue may have moved), not on a timer."""
            seen = 0
            while time.monotonic() < deadline:
                with answered:
                    answered.wait_for(lambda: len(statuses) > seen, TIMEOUT)
                    seen = len(statuses)
                response = httpx.get(server.url + "/readyz", timeout=30)
                readiness.append((response.status_code, response.json()["status"]))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)] + [threading.Thread(target=prober)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(QUEUE_SECONDS + TIMEOUT)
        assert not problems, problems[:10]
        assert set(statuses) <= {200, 503}
        accepted, rejected = statuses.count(200), statuses.count(503)
        assert accepted >= 3 and rejected >= 3, (accepted, rejected)
        assert (503, "queue_full") in readiness, readiness[:20]
        assert set(readiness) <= {(200, "ready"), (503, "queue_full")}
        after = wait_idle(server)
        assert metric(after, "edge_llm_rejections_total", reason="queue_full") - metric(
            before, "edge_llm_rejections_total", reason="queue_full") == rejected
        assert httpx.get(server.url + "/readyz", timeout=30).json() == {"status": "ready"}
        assert_serving(server)
        assert_no_unhandled_errors(server)
