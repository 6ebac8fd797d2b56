"""Run a real server as a subprocess on loopback: for integration tests and benchmarks, this project's and yours.

    from edge_llm.testing.server import run_server

    def test_my_client(tmp_path):
        with run_server(tmp_path, "--parallel", "2") as server:  # `edge-llm serve`, ready to answer
            response = httpx.post(server.url + "/v1/chat/completions", json=...)
        # stopped here (SIGINT, as Ctrl+C; SIGKILL if it has not exited after 30 s); the log is server.log_path

`run_server` starts `edge-llm serve` on a free port with the model under test: $EDGE_LLM_TEST_MODEL, else the
default model (`edge-llm model fetch`). `run_process` does the same for any server command (the benchmark runs
llama_cpp.server with it). Only the standard library is imported (and edge_llm.models.fetch, for the default
model's path), so a test process or a benchmark harness loads neither llama.cpp nor the server by importing it.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from edge_llm.models.fetch import default_model_path

logger = logging.getLogger(__name__)

MODEL_ENV = "EDGE_LLM_TEST_MODEL"
MODEL = Path(os.environ.get(MODEL_ENV) or default_model_path())
MODEL_ID = MODEL.name.removesuffix(".gguf")
STOP_TIMEOUT = 30.0
# The default --threads of servers started here (2); a test runner with N parallel workers on 2 cores sets it to 1.
THREADS_ENV = "EDGE_LLM_TEST_THREADS"
THREADS = int(os.environ.get(THREADS_ENV) or 2)
# Loopback only: a proxy from the environment (http_proxy) must not see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def require_model(model: Path = MODEL) -> Path:
    if not model.is_file():
        raise RuntimeError(f"the test model is missing: {model} (run `edge-llm model fetch`, "
                           f"or set {MODEL_ENV} to a GGUF file)")
    return model


def environment(changes: dict[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `changes` applied (None removes a variable)."""
    merged: dict[str, str | None] = {**os.environ, **(changes or {})}
    return {name: value for name, value in merged.items() if value is not None}


# free_port's ports: below Linux's ephemeral range (32768-60999), so no outgoing connection takes one between
# free_port and the server's bind, and each claimed for the life of this process with a byte-range lock (offset =
# port) on one file shared by every test process, so parallel test runners (pytest-xdist workers) never get the
# same port.
PORTS = range(20000, 32000)
_PORT_CLAIMS = Path(tempfile.gettempdir()) / "edge-llm-test-ports.lock"
_claims: list[IO[bytes]] = []
_next_port = itertools.cycle(PORTS)


def free_port() -> int:
    """A loopback port that nothing listens on and that no other test process has been given."""
    if not _claims:
        _claims.append(_PORT_CLAIMS.open("ab"))  # kept open: closing it would drop every claim
    for _ in PORTS:
        port = next(_next_port)
        try:
            fcntl.lockf(_claims[0], fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port)
        except OSError:  # another test process holds this one
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use by something else
                continue
        return port
    raise RuntimeError(f"no free port in {PORTS}")


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def serve_command(port: int, *flags: str, model: Path | None = MODEL, threads: int | None = THREADS) -> list[str]:
    """`edge-llm serve` with this Python. THREADS threads by default (2, or $EDGE_LLM_TEST_THREADS): tests share
    the machine; None lets the server take every core. model=None passes no --model, so the server looks for its
    default model itself."""
    command = [sys.executable, "-m", "edge_llm", "serve"]
    command += [] if model is None else ["--model", str(model)]
    command += ["--port", str(port)]
    command += [] if threads is None else ["--threads", str(threads)]
    return command + list(flags)


@contextmanager
def run_server(log_dir: Path, *flags: str, model: Path | None = MODEL, threads: int | None = THREADS,
               env: dict[str, str | None] | None = None, cwd: Path | None = None, startup_timeout: float = 120,
               log_name: str | None = None) -> Iterator[RunningServer]:
    """`edge-llm serve *flags` on a free loopback port, yielded once /readyz answers 200 (the model is loaded).
    Its output goes to log_dir/`log_name` (default server-PORT.log); `env` adds to the environment."""
    if model is not None:
        require_model(model)
    port = free_port()
    command = serve_command(port, *flags, model=model, threads=threads)
    with run_process(command, f"http://127.0.0.1:{port}", log_dir / (log_name or f"server-{port}.log"),
                     env=env, cwd=cwd, startup_timeout=startup_timeout) as server:
        yield server


@contextmanager
def run_process(command: Sequence[str], url: str, log_path: Path, *, ready_path: str = "/readyz",
                env: dict[str, str | None] | None = None, cwd: Path | None = None,
                startup_timeout: float = 120) -> Iterator[RunningServer]:
    """Any server `command` that will listen at `url`: yielded once GET url+ready_path answers 200, stopped on
    exit (SIGINT, then SIGKILL after STOP_TIMEOUT seconds)."""
    logger.info("starting %s (log: %s)", " ".join(command), log_path)
    with log_path.open("wb") as log:
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=environment(env))
    server = RunningServer(url, process, log_path)
    try:
        wait_ready(server, ready_path, startup_timeout)
        yield server
    finally:
        stop(process)


def wait_ready(server: RunningServer, path: str = "/readyz", timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            with _OPENER.open(server.url + path, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 while the model loads
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout}s:\n{server.log()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
