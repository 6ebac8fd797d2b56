"""`edge-llm serve` with faults a test triggers from outside, so that the product carries no test hooks:

- SIGUSR1: the engine thread dies at its next decode step, as if llama.cpp had failed there (the server then fails
  what is in flight and exits 1, as for any engine death);
- SIGUSR2: the engine thread gets stuck in its next decode step, as in a llama.cpp call that nothing can interrupt
  (it writes `STUCK_LINE` to stderr once it is);
- $EDGE_LLM_FAULT_SAVE_STALL=1: each prefix-cache save stops before its temporary file is synced and renamed, so
  a kill lands in the middle of a save; SIGHUP lets that save and every later one go on.

Started by `fault_server_command` (`python -m tests.fault_server serve FLAGS…` from the repository's root).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edge_llm.testing.server import MODEL, THREADS, RunningServer, free_port, require_model, run_process

REPO = Path(__file__).resolve().parents[1]
SAVE_STALL_ENV = "EDGE_LLM_FAULT_SAVE_STALL"
STUCK_LINE = "fault: the engine thread is stuck in a decode"


def fault_server_command(port: int, *flags: str, model: Path = MODEL, threads: int = THREADS) -> list[str]:
    """The command line of this server (run it with cwd=REPO, so that `tests` is importable)."""
    return [sys.executable, "-m", "tests.fault_server", "serve", "--model", str(model), "--port", str(port),
            "--threads", str(threads), *flags]


@contextmanager
def run_fault_server(log_dir: Path, *flags: str, env: dict[str, str | None] | None = None,
                     model: Path | None = None) -> Iterator[RunningServer]:
    """As `run_server` (the default model unless `model`), with the faults above ready to trigger."""
    port = free_port()
    command = fault_server_command(port, *flags, model=model or require_model())
    with run_process(command, f"http://127.0.0.1:{port}", log_dir / f"server-{port}.log", env=env,
                     cwd=REPO) as server:
        yield server


def _faulty_decode(decode: Callable[..., Any], killed: threading.Event, stuck: threading.Event) -> Callable[..., Any]:
    def decode_unless_faulted(self: Any, plan: Any) -> Any:
        if killed.is_set():
            raise RuntimeError("the engine thread was killed by the test (SIGUSR1)")
        if stuck.is_set():
            print(STUCK_LINE, file=sys.stderr, flush=True)
            threading.Event().wait()  # never set: only the process's end frees the thread
        return decode(self, plan)

    return decode_unless_faulted


def _stalling_os(released: threading.Event) -> types.SimpleNamespace:
    """The os module as the prefix store sees it, with an fsync of a regular file (the temporary file, before its
    rename) that first waits for `released`."""

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            released.wait()
        os.fsync(fd)

    return types.SimpleNamespace(**{**vars(os), "fsync": fsync})


def install_faults() -> None:
    # Imported here: a test process importing this module for its helpers loads neither llama.cpp nor the server.
    from edge_llm.engine.llama.runner import LlamaRunner
    from edge_llm.engine.prefix_cache import store

    killed, stuck = threading.Event(), threading.Event()
    LlamaRunner.decode = _faulty_decode(LlamaRunner.decode, killed, stuck)  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, lambda signum, frame: killed.set())
    signal.signal(signal.SIGUSR2, lambda signum, frame: stuck.set())
    if os.environ.get(SAVE_STALL_ENV) == "1":
        released = threading.Event()
        signal.signal(signal.SIGHUP, lambda signum, frame: released.set())
        store.os = _stalling_os(released)  # type: ignore[assignment]


if __name__ == "__main__":
    from edge_llm.cli.main import main

    install_faults()
    raise SystemExit(main())
