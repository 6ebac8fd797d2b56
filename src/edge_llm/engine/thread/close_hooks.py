"""Callbacks that run once on the engine thread when it ends, after the last request is answered and before the
model is freed (engine/thread/worker.py): whoever uses the runner from another thread (the facade's tokenizer thread)
stops there."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class CloseHooks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []
        self._ran = False

    def add(self, hook: Callable[[], None]) -> None:
        """Queues `hook`; added after the hooks ran, it runs at once (on the caller's thread)."""
        with self._lock:
            if not self._ran:
                self._hooks.append(hook)
                return
        hook()

    def run(self) -> None:
        with self._lock:
            hooks, self._hooks = self._hooks, []
            self._ran = True
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - the model is freed whatever a hook does
                logger.exception("engine close hook failed")
