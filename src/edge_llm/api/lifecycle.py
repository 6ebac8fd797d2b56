"""Readiness and graceful shutdown.

On the first SIGTERM/SIGINT the server keeps listening but refuses new work (503 `shutting_down`,
/readyz 503), lets the requests in flight finish for up to `--drain-timeout` seconds, then stops
the engine, which ends whatever is left with an error event, and asks the HTTP server to exit.
A second signal cuts the drain short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

from edge_llm.registry.registry import ModelRegistry

logger = logging.getLogger(__name__)

_POLL = 0.05
_AFTER_CANCEL_GRACE = 5.0  # for cancelled streams to write their error event
# After the drain and the grace above: a thread stuck in work that cannot be stopped (a grammar compile inside
# llama.cpp) would hold the process forever, and SIGTERM must end it (issue 41).
_HARD_EXIT_AFTER = 10.0
_HARD_EXIT_CODE = 1


def _exit_now() -> None:
    logger.error("still running %.0f s after the drain: a thread is stuck in work that cannot be stopped; exiting now",
                 _HARD_EXIT_AFTER)
    logging.shutdown()
    os._exit(_HARD_EXIT_CODE)


def _terminate_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Lifecycle:
    def __init__(self, registry: ModelRegistry, drain_timeout: float) -> None:
        self.registry = registry  # every model's engine, through the registry
        self.drain_timeout = drain_timeout
        self.draining = False
        self.in_flight = 0  # requests being served, health/readiness/metrics excluded
        # How the HTTP server is told to exit; the CLI sets it to uvicorn's `should_exit`.
        self.request_exit: Callable[[], None] = _terminate_process
        self._task: asyncio.Task[None] | None = None
        self._cut_short: asyncio.Event | None = None

    # ---- readiness ------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        ready, status = self.registry.readiness()
        if ready and self.registry.stall() is not None:
            return False, "degraded"  # a thread is stuck past --watchdog-seconds: send work elsewhere meanwhile
        return ready, status

    # ---- shutdown (event loop only) ----------------------------------------------------------

    def shutdown(self, reason: str, *, grace: float | None = None) -> None:
        """Starts draining; called again while draining, it cancels what is left at once."""
        if self._task is not None:
            if self._cut_short is not None and not self._cut_short.is_set():
                logger.warning("second shutdown request (%s): cancelling %d requests now", reason, self.in_flight)
                self._cut_short.set()
            return
        self.draining = True
        self._cut_short = asyncio.Event()
        timeout = self.drain_timeout if grace is None else min(grace, self.drain_timeout)
        self._task = asyncio.get_running_loop().create_task(self._drain(reason, timeout))
        hard_exit = threading.Timer(timeout + _AFTER_CANCEL_GRACE + _HARD_EXIT_AFTER, _exit_now)
        hard_exit.daemon = True  # a process that ends in time ends it too
        hard_exit.start()

    async def _drain(self, reason: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        logger.info("shutting down (%s): no new requests; %d in flight get up to %.0f s to finish",
                    reason, self.in_flight, timeout)
        await self._wait_idle(loop.time() + timeout)
        if self.in_flight > 0:
            logger.warning("drain time over: cancelling %d requests", self.in_flight)
        await asyncio.to_thread(self.registry.close)  # ends anything left with a `shutting_down` error event
        await self._wait_idle(loop.time() + _AFTER_CANCEL_GRACE)
        logger.info("drained; exiting")
        self.request_exit()

    async def _wait_idle(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        assert self._cut_short is not None
        while self.in_flight > 0 and loop.time() < deadline and not self._cut_short.is_set():
            try:
                await asyncio.wait_for(self._cut_short.wait(), _POLL)
            except asyncio.TimeoutError:
                pass
