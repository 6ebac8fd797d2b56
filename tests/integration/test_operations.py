"""Operations end to end: health and readiness, metrics, logs, keys, Host/Origin, limits, timeouts,
graceful drain and engine death, each against a real `edge-llm serve` process."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import MODEL_ID, RunningServer, environment, free_port, run_server, serve_command
from tests.fault_server import REPO, STUCK_LINE, fault_server_command, run_fault_server
from tests.helpers import chat_body, metric, parse_sse, port_of, scrape, sse_events, total, wait_for
from tests.server_pool import DEFAULT_FLAGS, ServerWith

CHAT = "/v1/chat/completions"
FLAG_KEY = "sk-test-flag-key"
FILE_KEY = "sk-test-file-key"
AUTH = {"Authorization": f"Bearer {FLAG_KEY}"}
LONG_TASK = "Write the numbers from 1 to 3000, separated by commas."
TIMEOUT = 300  # the machine is shared: be patient, assert on outcomes rather than speed


# ---- helpers ---------------------------------------------------------------------------------


def log_lines(server: RunningServer) -> list[dict[str, Any]]:
    """Every complete line of a JSON-format server log, parsed (a line that is not JSON fails the test). The
    last line may still be being written while the server runs: it counts once its newline is there."""
    text = server.log()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def access_lines(server: RunningServer, request_id: str) -> list[dict[str, Any]]:
    return [line for line in log_lines(server)
            if line.get("logger") == "edge_llm.access" and line.get("request_id") == request_id]


def wait_for_access_line(server: RunningServer, request_id: str) -> dict[str, Any]:
    wait_for(lambda: bool(access_lines(server, request_id)), 30, f"the access line of {request_id}")
    return access_lines(server, request_id)[0]


def raw_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Stream:
    """A streaming request read to its end on a thread; `started` is set once a token arrives."""

    def __init__(self, server: RunningServer, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self.events: list[tuple[str, str]] = []
        self.status = 0
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, body, headers or {}), daemon=True)
        self._thread.start()

    def _run(self, server: RunningServer, body: dict[str, Any], headers: dict[str, str]) -> None:
        try:
            with httpx.stream("POST", server.url + CHAT, json=body, headers=headers, timeout=TIMEOUT) as response:
                self.status = response.status_code
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    return  # an error answer: no events
                for name, data in sse_events(response):
                    self.events.append((name, data))
                    if name == "message":
                        self.started.set()
        finally:
            self.started.set()

    def join(self, timeout: float = TIMEOUT) -> list[tuple[str, str]]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"
        return self.events

    def wait_started(self) -> None:
        assert self.started.wait(TIMEOUT), "no token arrived"
        assert any(name == "message" for name, _ in self.events), self.events


class RawStream:
    """A request on a bare socket, for clients that hang up, or stop reading, when the test says so."""

    def __init__(self, server: RunningServer, body: dict[str, Any], receive_buffer: int | None = None) -> None:
        payload = json.dumps(body).encode()
        self.sock = socket.socket()
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(("127.0.0.1", port_of(server)))
        self.sock.sendall(raw_request("POST", CHAT, {"Host": "127.0.0.1", "Content-Type": "application/json",
                                                     "Content-Length": str(len(payload))}, payload))
        self.received = b""

    def read_until(self, marker: bytes) -> None:
        while marker not in self.received:
            chunk = self.sock.recv(4096)
            assert chunk, self.received
            self.received += chunk

    def hang_up(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


@contextmanager
def spawned(tmp_dir: Path, *flags: str, env: dict[str, str] | None = None,
            faults: bool = False) -> Iterator[RunningServer]:
    """A server process not yet waited for (to watch it load); killed at the end if still running. `faults`: the
    test's fault server (tests/fault_server.py), whose engine thread dies on SIGUSR1."""
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    command = fault_server_command(port, *flags) if faults else serve_command(port, *flags)
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment(env),
                                   cwd=REPO if faults else None)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", process, log_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ---- the operations server: keys, Host/Origin, limits, metrics, logs ----------------------------------


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ops")
    keys = tmp / "keys.txt"
    keys.write_text(f"# one key a line\n\n{FILE_KEY}\n")
    config = tmp / "edge-llm.toml"
    # From the file: a cap of 4 tokens, the allowed host; max_prompt_tokens 200 is overridden by the environment.
    config.write_text('max_tokens_cap = 4\nmax_prompt_tokens = 200\nallowed_hosts = ["good.example"]\n')
    with run_server(
        tmp, "--config", str(config), "--api-key", FLAG_KEY, "--api-key-file", str(keys),
        "--cors-origins", "http://app.example,localhost", "--max-headers", "30", "--max-header-bytes", "4096",
        "--max-body-bytes", "65536", "--parallel", "2",
        env={"EDGE_LLM_MAX_PROMPT_TOKENS": "100"},
    ) as running:
        yield running


ROUTES = [
    ("GET", "/v1/models"),
    ("GET", f"/v1/models/{MODEL_ID}"),
    ("POST", CHAT),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/no/such/route"),
]


def call(server: RunningServer, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = chat_body(max_tokens=1) if method == "POST" else None
    return httpx.request(method, server.url + path, json=body, headers=headers, timeout=TIMEOUT)


def assert_error(response: httpx.Response, status: int, code: str, error_type: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    if error_type:
        assert error["type"] == error_type
    return error


def test_probes_need_no_key_and_skip_the_host_check(ops: RunningServer) -> None:
    for path in ("/healthz", "/readyz"):
        assert httpx.get(ops.url + path).status_code == 200
        assert httpx.get(ops.url + path, headers={"Host": "evil.example"}).status_code == 200
    assert httpx.get(ops.url + "/healthz").json() == {"status": "ok", "model_loaded": True}
    assert httpx.get(ops.url + "/readyz").json() == {"status": "ready"}


def test_every_other_route_needs_a_key(ops: RunningServer) -> None:
    before = scrape(ops, AUTH)
    for method, path in ROUTES:
        for headers in (None, {"Authorization": "Bearer wrong-key"}, {"Authorization": f"Basic {FLAG_KEY}"},
                        {"Authorization": "Bearer"}):
            response = call(ops, method, path, headers)
            assert_error(response, 401, "invalid_api_key", "authentication_error")
            assert response.headers["www-authenticate"] == "Bearer"
        expected = 404 if path == "/no/such/route" else 200
        assert call(ops, method, path, AUTH).status_code == expected, (method, path)
    assert httpx.get(ops.url + "/v1/models", headers={"Authorization": f"Bearer {FILE_KEY}"}).status_code == 200
    after = scrape(ops, AUTH)
    assert metric(after, "edge_llm_rejections_total", reason="auth") - metric(
        before, "edge_llm_rejections_total", reason="auth") == 4 * len(ROUTES)
    # Failed attempts are logged, with their request id, never with the key they carried.
    failures = [line for line in log_lines(ops) if line["msg"].startswith("authentication failed")]
    assert {"missing key", "wrong key", "malformed Authorization header"} <= {
        line["msg"].removeprefix("authentication failed: ") for line in failures}
    assert all(line.get("request_id") for line in failures)
    assert "wrong-key" not in ops.log()


def test_host_header_check(ops: RunningServer) -> None:
    port = port_of(ops)
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.nip.io", "localhost.evil.example"):
        assert_error(httpx.get(ops.url + "/v1/models", headers={**AUTH, "Host": host}), 403, "host_not_allowed",
                     "permission_error")
    for host in (f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}", f"[::1]:{port}", "good.example",
                 f"GOOD.example:{port}"):
        assert httpx.get(ops.url + "/v1/models", headers={**AUTH, "Host": host}).status_code == 200, host
    assert metric(scrape(ops, AUTH), "edge_llm_rejections_total", reason="host_not_allowed") >= 4


def test_origin_check_and_cors(ops: RunningServer) -> None:
    url = ops.url + "/v1/models"
    assert_error(httpx.get(url, headers={**AUTH, "Origin": "http://evil.example"}), 403, "origin_not_allowed")
    assert_error(httpx.get(url, headers={**AUTH, "Origin": "null"}), 403, "origin_not_allowed")
    # A listed origin gets CORS headers; so does its preflight (which carries no key).
    allowed = httpx.get(url, headers={**AUTH, "Origin": "http://app.example"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-request-id" in allowed.headers["access-control-expose-headers"].lower()
    preflight = httpx.options(ops.url + CHAT, headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    refused = httpx.options(ops.url + CHAT, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    # The `localhost` keyword (llama-server's): any port on a loopback name, and nothing that only starts like one.
    for local in ("http://localhost:5173", "http://127.0.0.1:3000", "https://[::1]"):
        answered = httpx.get(url, headers={**AUTH, "Origin": local})
        assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == local
        preflight = httpx.options(url, headers={"Origin": local, "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == local
    for lookalike in ("http://localhost.evil.example", "http://evil.example/localhost", "file://localhost"):
        assert_error(httpx.get(url, headers={**AUTH, "Origin": lookalike}), 403, "origin_not_allowed")
    # Same origin (a page served by this server itself) needs no listing; without an Origin (curl, SDKs) neither.
    assert httpx.get(url, headers={**AUTH, "Origin": ops.url}).status_code == 200
    assert "access-control-allow-origin" not in httpx.get(url, headers=AUTH).headers


def test_max_tokens_cap_from_the_config_file(ops: RunningServer) -> None:
    response = httpx.post(ops.url + CHAT, json=chat_body("Count from 1 to 100.", max_tokens=50), headers=AUTH,
                          timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 4
    assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_max_prompt_tokens_from_the_environment_beats_the_file(ops: RunningServer) -> None:
    before = scrape(ops, AUTH)
    error = assert_error(httpx.post(ops.url + CHAT, json=chat_body("word " * 150), headers=AUTH, timeout=TIMEOUT),
                         400, "context_length_exceeded", "invalid_request_error")
    assert "at most 100 prompt tokens" in error["message"]
    after = scrape(ops, AUTH)
    assert metric(after, "edge_llm_rejections_total", reason="context_too_long") == metric(
        before, "edge_llm_rejections_total", reason="context_too_long") + 1
    assert metric(after, "edge_llm_prompt_tokens_total") == metric(before, "edge_llm_prompt_tokens_total")


def test_header_count_and_size_limits(ops: RunningServer) -> None:
    many = {f"x-extra-{i}": "1" for i in range(40)}
    assert_error(httpx.get(ops.url + "/v1/models", headers={**AUTH, **many}), 431, "request_headers_too_large")
    big = {"x-big": "b" * 5000}
    assert_error(httpx.get(ops.url + "/v1/models", headers={**AUTH, **big}), 431, "request_headers_too_large")
    assert metric(scrape(ops, AUTH), "edge_llm_rejections_total", reason="headers_too_large") >= 2
    # A head that keeps growing without ending is cut off by the HTTP parser (a plain 400, connection closed).
    with socket.create_connection(("127.0.0.1", port_of(ops)), timeout=30) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: ")
        for _ in range(40):
            if select.select([sock], [], [], 0.05)[0]:
                break  # the server answered
            sock.sendall(b"s" * 1024)
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400"), reply


def test_body_limit_is_counted(ops: RunningServer) -> None:
    before = scrape(ops, AUTH)
    body = json.dumps(chat_body("a" * 70_000)).encode()
    response = httpx.post(ops.url + CHAT, content=body, headers={**AUTH, "content-type": "application/json"})
    assert_error(response, 413, "request_too_large")
    after = scrape(ops, AUTH)
    assert metric(after, "edge_llm_rejections_total", reason="body_too_large") == metric(
        before, "edge_llm_rejections_total", reason="body_too_large") + 1


def _process_start_unix(pid: int) -> float:
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_metrics_carry_the_servers_start_time_as_llama_server_does(ops: RunningServer) -> None:
    response = httpx.get(ops.url + "/metrics", headers=AUTH)
    started = int(response.headers["Process-Start-Time-Unix"])
    load_seconds = total(scrape(ops, AUTH), "edge_llm_model_load_duration_seconds_sum")
    # set when the app is built: after the process began, before its model was loaded (not at each scrape)
    process_start = _process_start_unix(ops.process.pid)
    assert int(process_start) - 1 <= started <= process_start + 30 + load_seconds


def test_metrics_move_with_requests(ops: RunningServer) -> None:
    before = scrape(ops, AUTH)
    route = {"route": CHAT, "method": "POST", "status": "200"}
    response = httpx.post(ops.url + CHAT, json=chat_body("Name a colour.", max_tokens=3), headers=AUTH,
                          timeout=TIMEOUT)
    assert response.status_code == 200
    usage = response.json()["usage"]
    after = scrape(ops, AUTH)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("edge_llm_http_requests_total", **route) == 1
    assert delta("edge_llm_http_request_duration_seconds_count", route=CHAT) == 1
    assert delta("edge_llm_prompt_tokens_total") == usage["prompt_tokens"]
    assert delta("edge_llm_cached_prompt_tokens_total") == usage["prompt_tokens_details"]["cached_tokens"]
    assert delta("edge_llm_generated_tokens_total") == usage["completion_tokens"]
    assert delta("edge_llm_time_to_first_token_seconds_count") == 1
    assert delta("edge_llm_queue_wait_seconds_count") == 1
    assert delta("edge_llm_inter_token_latency_seconds_count") == max(usage["completion_tokens"] - 1, 0) + (
        1 if response.json()["choices"][0]["finish_reason"] == "stop" else 0)
    assert delta("edge_llm_generations_finished_total", reason=response.json()["choices"][0]["finish_reason"]) == 1
    # The scrape's own request is counted by the next scrape, labelled by route template.
    assert delta("edge_llm_http_requests_total", route="/metrics", method="GET", status="200") == 1
    for name in ("edge_llm_queue_depth", "edge_llm_running_sequences", "edge_llm_http_requests_in_flight",
                 "edge_llm_draining"):
        assert metric(after, name) == 0, name
    assert metric(after, "edge_llm_kv_cells_total") > 0
    assert 0 < metric(after, "edge_llm_kv_cache_usage_ratio") <= 1  # the finished sequence stays cached
    assert metric(after, "edge_llm_engine_alive") == 1 and metric(after, "edge_llm_ready") == 1
    for phase in ("queued", "prefill", "decode"):
        assert ("edge_llm_cancellations_total", (("phase", phase),)) in after
    missing = httpx.get(ops.url + f"/v1/models/{MODEL_ID}", headers=AUTH)
    assert missing.status_code == 200
    assert metric(scrape(ops, AUTH), "edge_llm_http_requests_total", route="/v1/models/{model_id:path}",
                  method="GET", status="200") >= 1


def test_json_logs_carry_the_request_id(ops: RunningServer) -> None:
    marker = "zebra-marker-5521"
    response = httpx.post(ops.url + CHAT, json=chat_body(f"Repeat: {marker}", max_tokens=3),
                          headers={**AUTH, "X-Request-Id": "ops-test-42"}, timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "ops-test-42"
    line = wait_for_access_line(ops, "ops-test-42")
    usage = response.json()["usage"]
    assert line["level"] == "info" and line["msg"] == f"POST {CHAT} 200"
    assert line["method"] == "POST" and line["path"] == CHAT and line["status"] == 200
    assert line["prompt_tokens"] == usage["prompt_tokens"]
    assert line["completion_tokens"] == usage["completion_tokens"]
    assert line["finish_reason"] == response.json()["choices"][0]["finish_reason"]
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    assert "prompt" not in line and "output" not in line
    assert marker not in ops.log()  # prompts are not logged without --log-prompts
    # A refused request has its access line too, with the error code.
    refused = httpx.get(ops.url + "/v1/models", headers={"X-Request-Id": "ops-test-43"})
    assert refused.headers["x-request-id"] == "ops-test-43"
    line = wait_for_access_line(ops, "ops-test-43")
    assert line["status"] == 401 and line["error_code"] == "invalid_api_key"
    # An id that is not sane is replaced by a generated one.
    for bad in ("has spaces in it", "x" * 200, "quote\"d"):
        generated = httpx.get(ops.url + "/v1/models", headers={**AUTH, "X-Request-Id": bad}).headers["x-request-id"]
        assert generated != bad and len(generated) == 32
        wait_for_access_line(ops, generated)
    assert all(line["ts"] and line["level"] and line["logger"] for line in log_lines(ops))


# ---- streams: cancellation phases, idle clients, --log-prompts --------------------------------------


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("streams"), "--parallel", "1", "--batch-size", "16",
                    "--cache-slots", "0", "--stream-idle-timeout", "2", "--log-prompts") as running:
        yield running


def test_cancellations_are_counted_by_phase(streams: RunningServer) -> None:
    def cancelled(phase: str) -> float:
        return metric(scrape(streams), "edge_llm_cancellations_total", phase=phase)

    start = {phase: cancelled(phase) for phase in ("queued", "prefill", "decode")}
    running = RawStream(streams, {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 400})
    running.read_until(b"\r\n\r\n")
    running.read_until(b"data: ")  # a token: it is decoding
    queued = RawStream(streams, chat_body(LONG_TASK, max_tokens=400, stream=True))
    wait_for(lambda: metric(scrape(streams), "edge_llm_queue_depth") == 1, what="a queued request")
    queued.hang_up()
    wait_for(lambda: cancelled("queued") == start["queued"] + 1, what="the queued cancellation")
    running.hang_up()
    wait_for(lambda: cancelled("decode") == start["decode"] + 1, what="the decode cancellation")
    wait_for(lambda: metric(scrape(streams), "edge_llm_running_sequences") == 0, what="a free sequence")

    # A long prompt, prefilled 16 tokens a step: hang up once it has a sequence but no token yet.
    first_tokens = metric(scrape(streams), "edge_llm_time_to_first_token_seconds_count")
    long_prompt = RawStream(streams, chat_body("Summarise: " + "the quick brown fox jumps over the lazy dog. " * 120,
                                               max_tokens=50, stream=True))
    wait_for(lambda: metric(scrape(streams), "edge_llm_running_sequences") == 1, what="the long prompt admitted")
    assert metric(scrape(streams), "edge_llm_time_to_first_token_seconds_count") == first_tokens
    long_prompt.hang_up()
    wait_for(lambda: cancelled("prefill") == start["prefill"] + 1, what="the prefill cancellation")
    assert cancelled("decode") == start["decode"] + 1 and cancelled("queued") == start["queued"] + 1


def test_a_client_that_stops_reading_is_disconnected_and_its_sequence_freed(streams: RunningServer) -> None:
    before = scrape(streams)
    stalled = RawStream(streams, chat_body(LONG_TASK, max_tokens=2000, stream=True), receive_buffer=1024)
    try:
        # Read nothing; the server's buffers fill, its send waits 2 s, then it hangs up.
        wait_for(lambda: metric(scrape(streams), "edge_llm_stream_idle_disconnects_total")
                 == metric(before, "edge_llm_stream_idle_disconnects_total") + 1, TIMEOUT, "the idle disconnect")
        wait_for(lambda: metric(scrape(streams), "edge_llm_running_sequences") == 0, 30, "the sequence freed")
        after = scrape(streams)
        assert metric(after, "edge_llm_cancellations_total", phase="decode") == metric(
            before, "edge_llm_cancellations_total", phase="decode") + 1
        assert metric(after, "edge_llm_generations_finished_total", reason="length") == metric(
            before, "edge_llm_generations_finished_total", reason="length")
        with pytest.raises((ConnectionResetError, AssertionError)):  # reset, or closed after the buffered bytes
            stalled.read_until(b"never sent")
    finally:
        stalled.sock.close()
    assert any(line.get("idle_timeout") for line in log_lines(streams) if line.get("logger") == "edge_llm.access")
    # The server goes on serving.
    assert httpx.post(streams.url + CHAT, json=chat_body(), timeout=TIMEOUT).status_code == 200


def test_log_prompts_puts_prompt_and_output_in_the_access_line(streams: RunningServer) -> None:
    response = httpx.post(streams.url + CHAT, json=chat_body("Say the word hello.", max_tokens=4),
                          headers={"X-Request-Id": "log-prompts-1"}, timeout=TIMEOUT)
    line = wait_for_access_line(streams, "log-prompts-1")
    assert line["prompt"] == [{"role": "user", "content": "Say the word hello."}]
    assert line["output"] == response.json()["choices"][0]["message"]["content"]


# ---- life and death: readiness through load, request timeout, engine death ------------------------------


@pytest.fixture(scope="module")
def mortal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, list[tuple[int, str]]]]:
    """The fault server (its engine thread dies on SIGUSR1); the statuses /readyz gave while it loaded come along.
    No request deadline here: a stream that the test kills must still be running when the signal arrives."""
    with spawned(tmp_path_factory.mktemp("mortal"), faults=True) as server:
        def readiness() -> tuple[int, str]:
            assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200  # alive throughout
            ready = httpx.get(server.url + "/readyz", timeout=30)
            return ready.status_code, ready.json()["status"]

        def logged(line: str) -> bool:
            assert server.process.poll() is None, server.log()
            return line in server.log()

        # Asked once it listens (uvicorn says so) and before its model is loaded (the registry says when), then
        # once after: events in its log, not a fast poll of /readyz.
        wait_for(lambda: logged("Uvicorn running on"), 120, "the server listening")
        seen = [readiness()]
        wait_for(lambda: logged(f"model {MODEL_ID} loaded in"), 120, "the model loaded")
        seen.append(readiness())
        yield server, seen


def test_readiness_through_load(mortal: tuple[RunningServer, list[tuple[int, str]]]) -> None:
    _, seen = mortal
    assert seen == [(503, "loading"), (200, "ready")]  # it listens while the model loads, then is ready


def test_request_timeout_ends_with_the_partial_output(server_with: ServerWith) -> None:
    server = server_with(*DEFAULT_FLAGS, "--request-timeout", "3")
    timeouts_before = metric(scrape(server), "edge_llm_generations_finished_total", reason="timeout")
    started = time.monotonic()
    response = httpx.post(server.url + CHAT, json=chat_body(LONG_TASK, max_tokens=3000), timeout=TIMEOUT)
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["choices"][0]["finish_reason"] == "timeout"
    assert completion["usage"]["completion_tokens"] < 3000
    assert elapsed < 3 + 30
    _, events = stream_simple(server, {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 3000})
    assert events[-1][0] == "done"
    assert json.loads(events[-1][1])["finish_reason"] == "timeout"
    assert metric(scrape(server), "edge_llm_generations_finished_total", reason="timeout") - timeouts_before == 2


def stream_simple(server: RunningServer, body: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, str]]]:
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=TIMEOUT) as response:
        raw = response.read().decode()
    return response, parse_sse(raw)


def test_engine_death_fails_streams_turns_unready_and_exits_nonzero(mortal: tuple[RunningServer, list]) -> None:
    server, _ = mortal
    stream = Stream(server, {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 500})
    stream.wait_started()
    # A request still uploading its body keeps the server in its short drain, so its state can be seen.
    uploading = socket.create_connection(("127.0.0.1", port_of(server)), timeout=30)
    uploading.sendall(raw_request("POST", CHAT, {"Host": "127.0.0.1", "Content-Type": "application/json",
                                                 "Content-Length": "100"}, b'{"prompt": '))
    try:
        wait_for(lambda: metric(scrape(server), "edge_llm_http_requests_in_flight") == 2, 30, "two requests in flight")
        server.process.send_signal(signal.SIGUSR1)  # the next decode step fails as llama.cpp would
        events = stream.join()
        assert events[-1][0] == "error"
        assert json.loads(events[-1][1])["error"]["code"] == "engine_unavailable"
        ready = httpx.get(server.url + "/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["status"] in ("engine_dead", "draining")
        health = httpx.get(server.url + "/healthz", timeout=30)
        assert health.status_code == 503 and health.json() == {"status": "engine_dead"}
        refused = httpx.post(server.url + CHAT, json=chat_body(), timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] in ("shutting_down", "engine_unavailable")
    finally:
        uploading.close()
    assert server.process.wait(60) == 1
    died = [line for line in log_lines(server) if line["msg"] == "engine thread died"]
    assert len(died) == 1 and "killed by the test (SIGUSR1)" in died[0]["exc"], died  # with its traceback


# ---- graceful shutdown ------------------------------------------------------------------------------


def test_sigterm_lets_running_streams_finish_and_refuses_new_work(tmp_path: Path) -> None:
    with run_server(tmp_path, "--drain-timeout", "120", "--log-format", "text") as server:
        body = {"prompt": "Count from 1 to 50, separated by spaces.", "temperature": 0, "max_tokens": 24}
        streams = [Stream(server, body), Stream(server, body)]
        for stream in streams:
            stream.wait_started()
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 503, 30, "/readyz 503")
        assert httpx.get(server.url + "/readyz").json() == {"status": "draining"}
        assert httpx.get(server.url + "/healthz").status_code == 200
        refused = httpx.post(server.url + CHAT, json=chat_body(), timeout=30)
        assert_error(refused, 503, "shutting_down")
        assert refused.headers["retry-after"]
        for stream in streams:
            events = stream.join()
            assert stream.status == 200
            assert events[-1][0] == "done", events[-3:]
            assert json.loads(events[-1][1])["finish_reason"] in ("stop", "length")
        assert server.process.wait(60) == 0
        assert "drained; exiting" in server.log()


# Doublings of nullable rules before a rare character: within the grammar bounds (1 537 parse stacks), but one pass
# of it over the vocabulary takes ~25 s here. With the step budget raised out of the way, and the tokens of "§" runs
# pushed out of the model's likeliest ones (so that the whole vocabulary is checked), it holds the engine thread in
# llama.cpp calls that nothing can stop.
def test_sigterm_ends_the_process_even_when_a_thread_is_stuck(tmp_path: Path) -> None:
    """A thread stuck where nothing can stop it (the fault server's engine thread blocks in a decode on SIGUSR2, as
    in a llama.cpp call that never returns): SIGTERM still ends the process, after the drain and the cancel grace."""
    with run_fault_server(tmp_path, "--ctx-size", "1024", "--parallel", "1", "--cache-slots", "0",
                          "--drain-timeout", "1") as server:
        started = threading.Event()

        def send() -> None:
            body = {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 3000, "stream": True}
            try:
                with httpx.stream("POST", server.url + CHAT, json=body, timeout=TIMEOUT) as response:
                    for line in response.iter_lines():
                        if line.startswith("data:"):
                            started.set()
            except httpx.HTTPError:
                pass  # the process ends under it

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        assert started.wait(TIMEOUT), "the stream did not start"
        server.process.send_signal(signal.SIGUSR2)
        wait_for(lambda: STUCK_LINE in server.log(), 120, "the engine thread to be stuck in a decode")
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(120) == 1  # drain 1 s, cancel grace 5 s, then 10 s: a hard exit
        sender.join(TIMEOUT)
    assert "a thread is stuck in work that cannot be stopped; exiting now" in server.log()


def test_sigint_after_the_drain_timeout_cancels_with_an_error_event(tmp_path: Path) -> None:
    with run_server(tmp_path, "--drain-timeout", "1") as server:
        stream = Stream(server, {"prompt": LONG_TASK, "temperature": 0, "max_tokens": 3000})
        stream.wait_started()
        server.process.send_signal(signal.SIGINT)
        events = stream.join()
        assert events[-1][0] == "error", events[-3:]
        assert json.loads(events[-1][1])["error"]["code"] == "shutting_down"
        assert server.process.wait(60) == 0
