"""Keep-alive comments (--sse-keepalive) against a real server: a stream queued behind a long answer gets
`: keep-alive` comments before its first event, and clients still read it (the openai SDK included)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from edge_llm.testing.server import MODEL_ID, RunningServer, run_server
from tests.helpers import chat_body, metric, parse_sse, scrape, wait_for

CHAT = "/v1/chat/completions"
INTERVAL = 0.2
KEEPALIVE = b": keep-alive\n\n"
TIMEOUT = 300
# Tokens of the answer the queued requests wait behind: the tests end it once they have seen a keep-alive, and it
# must outlast the queued request's way in (drafting counts fast).
LONG = 900


@pytest.fixture(scope="module")
def keepalive_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One sequence at a time, so a second request waits in the queue while the first one decodes."""
    with run_server(tmp_path_factory.mktemp("keepalive"), "--parallel", "1", "--cache-slots", "0",
                    "--ctx-size", "1024", "--sse-keepalive", str(INTERVAL)) as running:
        yield running


def long_answer_body(max_tokens: int) -> dict[str, Any]:
    return chat_body("Count from 1 to 500.", max_tokens=max_tokens, ignore_eos=True, stream=True)


def wait_until_decoding(response: httpx.Response) -> Iterator[str]:
    """Reads the long answer up to its first event (it holds the only sequence); returns the rest of its lines.
    Keep the iterator while the answer must go on: dropping it closes the connection, which cancels the answer."""
    assert response.status_code == 200
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data:"):
            return lines
    raise AssertionError("the long answer ended without a token")


def test_a_queued_stream_gets_keep_alive_comments_before_its_first_event(keepalive_server: RunningServer) -> None:
    with httpx.Client(base_url=keepalive_server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", CHAT, json=long_answer_body(LONG)) as long_answer:
            rest = wait_until_decoding(long_answer)
            # The simple body: its first event is the first text piece (an OpenAI stream starts with the role
            # chunk at once), so everything before it was sent while the request waited.
            simple = {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0}
            with http.stream("POST", CHAT, json=simple) as queued:
                assert queued.status_code == 200  # the headers come at once; the request waits in the queue
                wait_for(lambda: metric(scrape(keepalive_server), "edge_llm_queue_depth") == 1, TIMEOUT,
                         "the simple request waiting behind the long answer")
                raw = b""
                chunks = queued.iter_raw()
                while KEEPALIVE not in raw:
                    chunk = next(chunks, None)
                    if chunk is None:  # it ran without waiting: the long answer must have ended, say how
                        tail = list(rest)[-3:]
                        raise AssertionError(f"the queued stream ended without a keep-alive: {raw[:600]!r}; the "
                                             f"long answer ended with {tail}")
                    raw += chunk
                long_answer.close()  # the client leaves: the long answer is aborted and the queued one runs
                raw += b"".join(chunks)
    before_first_event = raw[:raw.index(b"data:")]
    assert before_first_event and set(before_first_event.split(KEEPALIVE)) == {b""}, raw[:300]
    events = parse_sse(raw.decode("utf-8"))
    assert events[-1][0] == "done" and json.loads(events[-1][1])["finish_reason"] in ("stop", "length")
    assert [name for name, _ in events[:-1]] == ["message"] * (len(events) - 1)  # text pieces; comments skipped


class KeepAliveSpy(httpx.HTTPTransport):
    """The openai client's transport: passes every byte through and sets `seen` at the first keep-alive."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        spy = self

        class Watched(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in response.stream:
                    if KEEPALIVE.strip() in chunk:
                        spy.seen.set()
                    yield chunk

            def close(self) -> None:
                response.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Watched(),
                              extensions=response.extensions)


def test_the_openai_sdk_reads_a_stream_with_keep_alive_comments(keepalive_server: RunningServer) -> None:
    spy = KeepAliveSpy()
    client = openai.OpenAI(base_url=keepalive_server.url + "/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=spy, timeout=TIMEOUT))
    with httpx.Client(base_url=keepalive_server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", CHAT, json=long_answer_body(LONG)) as long_answer:
            rest = wait_until_decoding(long_answer)

            def leave_once_kept_alive() -> None:
                if spy.seen.wait(TIMEOUT):
                    long_answer.close()  # aborts the long answer: the SDK's request runs now

            leaver = threading.Thread(target=leave_once_kept_alive, daemon=True)
            leaver.start()
            with client.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, stream=True,
            ) as stream:
                chunks = list(stream)
            leaver.join(TIMEOUT)
            del rest
    assert spy.seen.is_set()  # the SDK read keep-alive comments...
    assert chunks[0].choices[0].delta.role == "assistant"  # ...and every chunk around them
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
