"""Helpers shared by the reliability suite: the error envelope, metrics, process memory, raw HTTP."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.helpers import Samples, chat_body, metric, port_of, scrape, wait_for  # noqa: F401 (re-exported)
from edge_llm.testing.server import RunningServer

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TIMEOUT = 300  # the machine is shared: assert on outcomes, not on speed
# The hostile-input and fuzzing server, shared by both files (server_with): at most 8 tokens a choice, two
# sequences at a time; generation stays cheap.
HOSTILE_FLAGS = ("--max-tokens-cap", "8", "--ctx-size", "4096", "--parallel", "2", "--cache-slots", "2")
ENVELOPE_KEYS = {"message", "type", "param", "code"}


def env_int(name: str, default: int) -> int:
    """A size knob of the suite (documented in docs/reliability.md)."""
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def assert_envelope(status: int, body: bytes | str, where: str = "") -> dict[str, Any]:
    """An error answer is OpenAI's envelope: {"error": {"message", "type", "param", "code"}}, message non-empty."""
    try:
        parsed = json.loads(body)
    except ValueError:
        raise AssertionError(f"{where}: status {status} with a body that is not JSON: {body[:300]!r}") from None
    assert isinstance(parsed, dict) and set(parsed) == {"error"}, f"{where}: {status} {parsed!r:.300}"
    error = parsed["error"]
    assert isinstance(error, dict) and set(error) == ENVELOPE_KEYS, f"{where}: {status} {error!r:.300}"
    assert isinstance(error["message"], str) and error["message"], f"{where}: {error!r:.300}"
    assert isinstance(error["type"], str) and error["type"], f"{where}: {error!r:.300}"
    assert error["param"] is None or isinstance(error["param"], str), f"{where}: {error!r:.300}"
    assert error["code"] is None or isinstance(error["code"], str), f"{where}: {error!r:.300}"
    return error


def assert_error(response: httpx.Response, status: int, code: str | None = None,
                 param_prefix: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text[:500]}"
    error = assert_envelope(response.status_code, response.content, str(response.request.url))
    if code is not None:
        assert error["code"] == code, error
    if param_prefix is not None:
        assert (error["param"] or "").startswith(param_prefix), error
    return error


def post_raw(server: RunningServer, path: str, body: bytes, timeout: float = TIMEOUT, **headers: str
             ) -> httpx.Response:
    return httpx.post(server.url + path, content=body, timeout=timeout,
                      headers={"content-type": "application/json", **headers})


# ---- metrics -------------------------------------------------------------------------------------------


def wait_idle(server: RunningServer, timeout: float = 60) -> Samples:
    """Waits until no sequence runs, none waits and no HTTP request is in flight; returns that scrape."""
    last: list[Samples] = []

    def idle() -> bool:
        samples = scrape(server)
        last[:] = [samples]
        return all(metric(samples, name) == 0 for name in
                   ("edge_llm_running_sequences", "edge_llm_queue_depth", "edge_llm_http_requests_in_flight"))

    wait_for(idle, timeout, "the engine to go idle")
    return last[0]


def assert_serving(server: RunningServer) -> None:
    """The process lives, the probes are green and a small generation completes."""
    assert server.process.poll() is None, f"the server exited with {server.process.returncode}:\n{server.log()[-3000:]}"
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    assert httpx.get(server.url + "/readyz", timeout=30).status_code == 200
    response = httpx.post(server.url + CHAT, json=chat_body("Say OK."), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def assert_no_unhandled_errors(server: RunningServer) -> None:
    """No 500, and no exception that reached uvicorn (it logs those with a traceback)."""
    log = server.log()
    for sign in ("unhandled error", "internal_error", "Exception in ASGI application", "Traceback"):
        assert sign not in log, f"{sign!r} in the server log:\n{log[-5000:]}"


# ---- process memory ---------------------------------------------------------------------------------------


def rss_anon_kib(pid: int) -> int:
    """RssAnon of a process from /proc/PID/status, in KiB (anonymous memory: heap, arenas, not the model mmap)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError(f"no RssAnon in /proc/{pid}/status")


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_x = sum((x - mean_x) ** 2 for x, _ in points)
    if var_x == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var_x


# ---- raw HTTP -----------------------------------------------------------------------------------------------


def raw_head(method: str, path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_response_head(sock: socket.socket, limit: int = 65536) -> bytes:
    """Reads until the end of the response head (or until the server closes)."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def status_of(head: bytes) -> int:
    assert head.startswith(b"HTTP/1.1 "), head[:200]
    return int(head.split(b" ", 2)[1])


# ---- the neighbour: a small request beside a hostile one -------------------------------------------------------

# "A neighbour's 2-token request sent at the same time completes within a few seconds, measured against its time
# alone" (issue 41): the ratio is generous (2 shared cores); the slack covers one step that it may wait behind.
NEIGHBOUR_RATIO = 4
NEIGHBOUR_SLACK = 3.0


def neighbour_seconds(server: RunningServer) -> float:
    """The time of a 2-token completion (it must succeed)."""
    started = time.perf_counter()
    response = httpx.post(server.url + COMPLETIONS, json={"prompt": "Hello", "max_tokens": 2, "temperature": 0},
                          timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


def neighbour_alone(server: RunningServer) -> float:
    """The neighbour's median time with nothing beside it (after one warm-up)."""
    neighbour_seconds(server)
    return statistics.median(neighbour_seconds(server) for _ in range(5))


def neighbour_beside(server: RunningServer, path: str, body: bytes, alone: float, what: str,
                     neighbour: Callable[[RunningServer], float] = neighbour_seconds) -> httpx.Response:
    """Sends `body` (JSON) to `path` and, until it is answered, neighbours one after the other (at least one, so
    some neighbour runs while the hostile work does, whenever that starts), and asserts that the slowest of them
    stays within the neighbour bound; returns the hostile answer. On this shared machine a neighbour alone
    sometimes takes seconds (llama.cpp's compute threads wait for each other when another process holds a core), so
    a case over the bound is tried up to twice more: work that holds the neighbour holds it every time."""
    tries: list[float] = []
    while True:
        answers: list[httpx.Response] = []

        def hostile() -> None:
            answers.append(post_raw(server, path, body))

        thread = threading.Thread(target=hostile)
        thread.start()
        times: list[float] = []
        while thread.is_alive() or not times:
            times.append(neighbour(server))
        thread.join(TIMEOUT)
        assert answers, "the hostile request never got an answer"
        tries.append(max(times))
        if tries[-1] <= neighbour_bound(alone) or len(tries) == 3:
            break
    assert_neighbour_unhurt(min(tries), alone, f"{what} (tries: {[round(t, 2) for t in tries]})")
    return answers[0]


def neighbour_bound(alone: float) -> float:
    return NEIGHBOUR_RATIO * alone + NEIGHBOUR_SLACK


def assert_neighbour_unhurt(took: float, alone: float, what: str) -> None:
    assert took <= neighbour_bound(alone), \
        f"{what}: the neighbour took {took:.2f} s (alone {alone:.2f} s)"


@contextmanager
def neighbours_beside(server: RunningServer, alone: float, what: str) -> Iterator[None]:
    """Neighbours one after the other for as long as the block runs (at least one), the slowest within the neighbour
    bound: whatever the hostile requests of the block hold, a normal request sent beside them goes on."""
    stop = threading.Event()
    times: list[float] = []
    failures: list[BaseException] = []

    def neighbours() -> None:
        try:
            while not stop.is_set() or not times:
                times.append(neighbour_seconds(server))
        except BaseException as error:  # reported by the test, not lost in the thread
            failures.append(error)

    thread = threading.Thread(target=neighbours, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert not failures, f"{what}: a neighbour failed: {failures[0]!r}"
    assert times, f"{what}: no neighbour was answered"
    if max(times) > neighbour_bound(alone):
        # The machine is shared and its load swings: the time alone measured again right after, side by side.
        alone = max(alone, neighbour_alone(server))
    assert_neighbour_unhurt(max(times), alone, f"{what} (the slowest of {len(times)} neighbours)")
