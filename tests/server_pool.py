"""The session's shared servers, one per distinct set of flags (the `server_with` fixture of tests/conftest.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from edge_llm.testing.server import MODEL, RunningServer, run_server

logger = logging.getLogger(__name__)

# Most shared servers running at once beyond the kept ones (each holds its KV cache; the model file is mapped once
# by the kernel, so a server costs about its --ctx-size in memory). No module asks for more than this many.
SHARED_SERVERS = 3
# The session fixtures' flags (tests/integration/conftest.py): `server` and `repeatable_server`.
DEFAULT_FLAGS = ("--parallel", "4")
REPEATABLE_FLAGS = ("--parallel", "1", "--cache-slots", "0")
# The prefill chunk of `small_chunks_server` (its --batch-size).
SMALL_CHUNK = 64

ServerWith = Callable[..., RunningServer]
Key = tuple[tuple[str, ...], Path | None]


class ServerPool:
    """Servers started on first use and kept for the session, one per distinct (flags, model). Those asked for with
    keep=True (the session fixtures) stay to the end; of the others, the least recently used one is stopped when a
    new one would make more than `capacity`. A test module asks for its servers in module-scoped fixtures, so a
    server is not stopped while the module that asked for it runs (no module asks for more than `capacity`)."""

    def __init__(self, log_dir: Path, capacity: int) -> None:
        self.log_dir = log_dir
        self.capacity = capacity
        self._kept: dict[Key, RunningServer] = {}
        self._evictable: OrderedDict[Key, RunningServer] = OrderedDict()
        self._started = 0
        self._stops: dict[Key, ExitStack] = {}

    def get(self, *flags: str, model: Path | None = MODEL, keep: bool = False) -> RunningServer:
        key = (flags, model)
        known = self._kept.get(key) or self._evictable.get(key)
        if known is not None and known.process.poll() is None:
            if key in self._evictable:
                self._evictable.move_to_end(key)
            return known
        if known is not None:  # it died (the test that killed it says so): whoever asks next gets a new one
            self._stop(key)
        if not keep:
            while len(self._evictable) >= self.capacity:
                self._stop(next(iter(self._evictable)))
        stops = ExitStack()
        self._started += 1
        log_dir = self.log_dir / f"server-{self._started}"
        log_dir.mkdir()
        server = stops.enter_context(run_server(log_dir, *flags, model=model))
        logger.info("shared server %s: %s", server.url, " ".join(flags))
        self._stops[key] = stops
        (self._kept if keep else self._evictable)[key] = server
        return server

    def _stop(self, key: Key) -> None:
        self._kept.pop(key, None)
        self._evictable.pop(key, None)
        self._stops.pop(key).close()

    def close(self) -> None:
        for key in list(self._stops):
            self._stop(key)
