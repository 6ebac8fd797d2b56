"""Hostile connections (issue 41), on real sockets: a slowloris head, a body that stops or is cut mid-way, more
connections than the cap. Each is closed by the server (408, a 499 in the log, a 503 with Retry-After), counted in
edge_llm_connections_closed_total, while a neighbour's 2-token request sent at the same time completes about as
fast as alone, and the server's anonymous memory stays flat.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.reliability.support import (
    assert_neighbour_unhurt,
    neighbour_alone,
    neighbour_seconds,
    COMPLETIONS,
    TIMEOUT,
    assert_envelope,
    assert_no_unhandled_errors,
    assert_serving,
    metric,
    port_of,
    raw_head,
    rss_anon_kib,
    scrape,
    status_of,
    wait_for,
)

HEAD_TIMEOUT = 2
BODY_TIMEOUT = 2
MAX_CONNECTIONS = 12
RSS_BOUND_MIB = 16  # growth allowed over 60 hostile connections (allocator noise, not a per-connection leak)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("connections"), "--parallel", "2", "--ctx-size", "1024",
                    "--head-timeout", str(HEAD_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT),
                    "--max-connections", str(MAX_CONNECTIONS)) as running:
        yield running
        assert_serving(running)
        assert_no_unhandled_errors(running)


@pytest.fixture(scope="module")
def alone(server: RunningServer) -> float:
    return neighbour_alone(server)


def connect(server: RunningServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=TIMEOUT)
    return sock


def closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def closings(server: RunningServer, reason: str) -> float:
    return metric(scrape(server), "edge_llm_connections_closed_total", reason=reason)


def access_statuses(server: RunningServer, path: str) -> list[int]:
    statuses = []
    for line in server.log().splitlines():
        if line.startswith("{") and '"status"' in line:
            record = json.loads(line)
            if record.get("path") == path and "status" in record:
                statuses.append(record["status"])
    return statuses


def slowloris(server: RunningServer, answers: list[bytes]) -> None:
    """A head sent one byte every 0.2 s (40 s of bytes): only the server's head timeout ends it sooner."""
    head = raw_head("POST", COMPLETIONS, [("Host", "127.0.0.1"), ("Content-Type", "application/json")] +
                    [(f"X-Pad-{k}", "a" * 30) for k in range(5)])
    with connect(server) as sock:
        sock.settimeout(0.2)
        data = b""
        for byte in head[:-2]:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
        sock.settimeout(TIMEOUT)
        try:
            data += closed_by_server(sock)
        except ConnectionResetError:
            pass
        answers.append(data)


def test_a_slowloris_head_gets_408_and_the_neighbour_goes_on(server: RunningServer, alone: float) -> None:
    before = closings(server, "head_timeout")
    answers: list[bytes] = []
    threads = [threading.Thread(target=slowloris, args=(server, answers)) for _ in range(4)]
    for thread in threads:
        thread.start()
    took = neighbour_seconds(server)
    for thread in threads:
        thread.join(TIMEOUT)
    assert len(answers) == 4
    for answer in answers:
        assert status_of(answer) == 408, answer[:300]
        assert_envelope(408, answer.split(b"\r\n\r\n", 1)[1], "slowloris")
    assert_neighbour_unhurt(took, alone, "beside the hostile connection")
    assert closings(server, "head_timeout") == before + 4


def test_a_connection_that_sends_nothing_is_closed(server: RunningServer) -> None:
    before = closings(server, "head_timeout")
    with connect(server) as sock:
        assert closed_by_server(sock) == b""
    assert closings(server, "head_timeout") == before + 1


def test_a_body_that_stops_is_closed_and_logged_as_499(server: RunningServer, alone: float) -> None:
    before = closings(server, "body_timeout")
    with connect(server) as sock:
        sock.sendall(raw_head("POST", COMPLETIONS, [("Host", "127.0.0.1"), ("Content-Type", "application/json"),
                                                    ("Content-Length", "1000")]) + b'{"prompt": "x", ')
        took = neighbour_seconds(server)
        assert closed_by_server(sock) == b""
    assert_neighbour_unhurt(took, alone, "beside the hostile connection")
    assert closings(server, "body_timeout") == before + 1
    wait_for(lambda: 499 in access_statuses(server, COMPLETIONS), 30, "the 499 access line")


def test_a_body_cut_mid_way_is_a_499_not_a_500(server: RunningServer) -> None:
    samples = scrape(server)
    before = metric(samples, "edge_llm_http_requests_total", route=COMPLETIONS, method="POST", status="499")
    with connect(server) as sock:
        sock.sendall(raw_head("POST", COMPLETIONS, [("Host", "127.0.0.1"), ("Content-Type", "application/json"),
                                                    ("Content-Length", "1000")]) + b'{"prompt": "x", ')
    wait_for(lambda: metric(scrape(server), "edge_llm_http_requests_total", route=COMPLETIONS, method="POST",
                            status="499") == before + 1, 30, "the 499 in the metrics")
    assert 500 not in access_statuses(server, COMPLETIONS)


def test_connections_past_the_cap_get_503_with_retry_after(server: RunningServer) -> None:
    before = closings(server, "over_capacity")
    sockets = [connect(server) for _ in range(MAX_CONNECTIONS + 1)]  # opened at once, idle
    answers = []
    for sock in sockets:  # each is answered 503 at once, or closed silently by the head timeout
        with sock:
            answers.append(closed_by_server(sock))
    refused = [answer for answer in answers if answer]
    assert len(refused) == 1, [answer[:100] for answer in answers]
    assert status_of(refused[0]) == 503
    assert b"retry-after: 1" in refused[0].lower()
    error = assert_envelope(503, refused[0].split(b"\r\n\r\n", 1)[1], "over capacity")
    assert error["code"] == "too_many_connections"
    assert closings(server, "over_capacity") == before + 1
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200


def test_memory_stays_flat_over_hostile_connections(server: RunningServer) -> None:
    pid = server.process.pid
    for _ in range(2):  # warm: the first rounds allocate the buffers every later connection reuses
        with connect(server) as sock:
            sock.sendall(raw_head("POST", COMPLETIONS, [("Host", "x"), ("Content-Length", "100")]) + b"{")
    start = rss_anon_kib(pid)
    for _ in range(3):
        answers: list[bytes] = []
        threads = [threading.Thread(target=slowloris, args=(server, answers)) for _ in range(10)]
        for thread in threads:
            thread.start()
        for _ in range(10):
            with connect(server) as sock:
                sock.sendall(raw_head("POST", COMPLETIONS, [("Host", "x"), ("Content-Length", "100000")]) + b"{" * 5000)
        for thread in threads:
            thread.join(TIMEOUT)
        assert len(answers) == 10
    growth = (rss_anon_kib(pid) - start) / 1024
    assert growth < RSS_BOUND_MIB, f"RssAnon grew {growth:.1f} MiB over 60 hostile connections"
