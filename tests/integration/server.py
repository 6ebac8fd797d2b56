"""Runs a real `edge-llm serve` subprocess on loopback for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from edge_llm.models.fetch import default_model_path

REPO = Path(__file__).resolve().parents[2]
# EDGE_LLM_TEST_MODEL picks another GGUF; by default the tests use the model `edge-llm model fetch` gets.
MODEL = Path(os.environ.get("EDGE_LLM_TEST_MODEL") or default_model_path())
MODEL_ID = MODEL.name.removesuffix(".gguf")


def require_model() -> Path:
    if not MODEL.is_file():
        raise RuntimeError(f"the test model is missing: {MODEL} (run `edge-llm model fetch`, "
                           "or set EDGE_LLM_TEST_MODEL to a GGUF file)")
    return MODEL


def environment(changes: dict[str, str | None] | None) -> dict[str, str]:
    merged: dict[str, str | None] = {**os.environ, **(changes or {})}
    return {name: value for name, value in merged.items() if value is not None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def run_server(tmp_dir: Path, *flags: str, env: dict[str, str | None] | None = None, startup_timeout: float = 120,
               model: Path | None = MODEL, cwd: Path | None = None) -> Iterator[RunningServer]:
    """env adds to the environment (None removes a variable); model=None passes no --model, so the server
    looks for its default model itself."""
    require_model()
    port = free_port()
    log_path = tmp_dir / f"server-{port}.log"
    model_flags = [] if model is None else ["--model", str(model)]
    command = [sys.executable, "-m", "edge_llm", "serve", *model_flags, "--port", str(port), "--threads", "2", *flags]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                   env=environment(env))
    server = RunningServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(server, startup_timeout)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(server: RunningServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout}s:\n{server.log()}")
