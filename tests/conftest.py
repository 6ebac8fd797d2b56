"""Suite-wide set-up: the package's bytecode, compiled once per session; `server_with`, the session's shared servers
keyed by their flags.

This checkout is an editable install, and CI and the sandbox run with PYTHONDONTWRITEBYTECODE set, so without
`__pycache__` every server a test starts would compile each of the package's ~150 modules again (0.15-0.3 s of CPU
per start, issue 40); `pip install` and the Docker image compile them at install time, as this does here.
"""

from __future__ import annotations

import compileall
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under pytest-xdist with more than one worker (the README's command runs two), each server a test starts gets one
# thread unless the user chose: two servers of 2 threads on 2 cores oversubscribe them, and ggml's threads spin at
# their barriers. Set before edge_llm.testing.server (which reads it) is imported.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) > 1:
    os.environ.setdefault("EDGE_LLM_TEST_THREADS", "1")

import edge_llm  # noqa: E402 - after the threads are chosen
from tests.file_order import longest_files_first, recorded_durations  # noqa: E402
from tests.server_pool import SHARED_SERVERS, ServerPool, ServerWith  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:  # noqa: ARG001 - pytest's hook signature
    compileall.compile_dir(Path(edge_llm.__file__).parent, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items[:] = longest_files_first(items, recorded_durations())


@pytest.fixture(scope="session")
def server_with(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWith]:
    """`server_with(*flags, model=MODEL)`: the session's server started with these flags (started on first use;
    keep=True: never stopped before the session ends, for session-scoped fixtures).
    Tests that share one must only read what their own requests changed (metric deltas, their own log lines), and
    must not stop, reload or drain it: those start their own with run_server."""
    pool = ServerPool(tmp_path_factory.mktemp("shared"), SHARED_SERVERS)
    yield pool.get
    pool.close()
