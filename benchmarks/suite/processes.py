"""The servers under test as processes: ours (`edge-llm serve`), the peer (llama_cpp.server, from its own
virtualenv) and llama.cpp's C++ `llama-server` when its binary is there, all started, waited for and stopped by
the one server-process helper, edge_llm.testing.server."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from edge_llm.testing.server import RunningServer, free_port, run_process, run_server

from .plan import BENCH_DIR, REPO, SERVER_PARALLEL, THREADS

logger = logging.getLogger(__name__)

LLAMA_SERVER_ENV = "LLAMA_SERVER"  # the path of llama.cpp's llama-server binary (benchmarks/README.md: building it)
PEER_VENV = BENCH_DIR / ".venv-peer"
PEER_REQUIREMENTS = ("llama-cpp-python[server]==0.3.36", "matplotlib==3.11.2")
STARTUP_TIMEOUT_S = 180


@contextmanager
def ours(model: Path, log_dir: Path, *flags: str, log_name: str = "ours.log") -> Iterator[RunningServer]:
    """`edge-llm serve --parallel 8` with the benchmark's threads (and `flags`), logging to log_dir/`log_name`."""
    with run_server(log_dir, "--parallel", str(SERVER_PARALLEL), "--log-level", "warning", *flags, model=model,
                    threads=THREADS, cwd=REPO, startup_timeout=STARTUP_TIMEOUT_S, log_name=log_name) as server:
        wait_until_serving(server.url)
        yield server


def find_llama_server(explicit: Path | None = None) -> Path | None:
    """llama-server: `explicit` (--llama-server), else $LLAMA_SERVER, else the one on PATH; None when absent."""
    for candidate in (explicit, os.environ.get(LLAMA_SERVER_ENV), shutil.which("llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate).resolve()
    return None


@contextmanager
def llama_server(binary: Path, model: Path, log_dir: Path, parallel: int, ctx: int = 8192,
                 extra_flags: Sequence[str] = (), log_name: str = "llama-server.log") -> Iterator[RunningServer]:
    """llama.cpp's llama-server on the same model and threads: `parallel` slots sharing one unified KV cache of
    `ctx` cells (as ours), Prometheus metrics on, and `extra_flags` (e.g. `--cache-reuse 256`), logging to
    log_dir/`log_name`."""
    port = free_port()
    command = [str(binary), "--model", str(model), "--threads", str(THREADS), "--threads-batch", str(THREADS),
               "--parallel", str(parallel), "--ctx-size", str(ctx), "--kv-unified", "--metrics", "--jinja",
               *extra_flags, "--host", "127.0.0.1", "--port", str(port)]
    with run_process(command, f"http://127.0.0.1:{port}", log_dir / log_name, ready_path="/health",
                     cwd=REPO, startup_timeout=STARTUP_TIMEOUT_S) as server:
        wait_until_serving(server.url)
        yield server


@contextmanager
def peer(model: Path, log_dir: Path) -> Iterator[RunningServer]:
    """llama_cpp.server on the same model and threads, logging to log_dir/peer.log."""
    port = free_port()
    command = [str(peer_python()), "-m", "llama_cpp.server", "--model", str(model), "--n_threads", str(THREADS),
               "--n_threads_batch", str(THREADS), "--interrupt_requests", "False", "--host", "127.0.0.1",
               "--port", str(port)]
    with run_process(command, f"http://127.0.0.1:{port}", log_dir / "peer.log", ready_path="/v1/models",
                     cwd=REPO, startup_timeout=STARTUP_TIMEOUT_S) as server:
        wait_until_serving(server.url)
        yield server


def wait_until_serving(base_url: str, timeout_s: float = 180) -> None:
    """Ready is not always serving (a peer may answer /v1/models before its first completion works): wait
    for a 1-token completion."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peer_venv() -> Path:
    """benchmarks/.venv-peer with llama_cpp.server and matplotlib, created when missing."""
    python = peer_python()
    check = [str(python), "-c", "import llama_cpp.server, matplotlib"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    logger.info("creating %s with %s", PEER_VENV, ", ".join(PEER_REQUIREMENTS))
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    return python
