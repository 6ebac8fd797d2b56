"""A watchdog for a shared thread (the engine thread's steps, the tokenizer thread's jobs): a job still running
`limit` seconds after it started is reported once (a warning naming its requests, `stalls` counted) and shows as
`stall()` until it ends, which the server's /readyz turns into 503 "degraded".

It costs the watched thread two attribute writes per job and no wake-up of its own: the watchdog thread sleeps
on an event while the watched thread is idle, and while it is busy wakes once per `limit` seconds at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    what: str
    started: float
    request_ids: Callable[[], list[str]]


class Watchdog:
    def __init__(self, thread_name: str, limit: float | None) -> None:
        """`limit` seconds (None or 0: no watchdog, `job` is then nearly free)."""
        self.thread_name = thread_name
        self.limit = limit or None
        self.stalls = 0  # since start: jobs that ran past the limit
        self._job: _Job | None = None
        self._stalled: _Job | None = None
        self._busy = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        if self.limit is not None:
            self._thread = threading.Thread(target=self._watch, name=f"edge-llm-watchdog-{thread_name}", daemon=True)
            self._thread.start()

    def begin(self, what: str, request_ids: Callable[[], list[str]]) -> None:
        """On the watched thread, as a job starts; `request_ids` is called only if the job stalls."""
        if self.limit is None:
            return
        self._job = _Job(what, time.monotonic(), request_ids)
        if not self._busy.is_set():
            self._busy.set()

    def end(self) -> None:
        """On the watched thread, as the job ends."""
        self._job = None

    def stall(self) -> str | None:
        """What is stalled now, in words, or None."""
        job = self._stalled
        if job is None or self._job is not job:
            return None
        ids = ", ".join(job.request_ids()) or "no request"
        return (f"the {self.thread_name} thread has been on one {job.what} for {time.monotonic() - job.started:.1f} s "
                f"(watchdog {self.limit:g} s; {ids})")

    def close(self) -> None:
        self._closed = True
        self._busy.set()

    def _watch(self) -> None:
        assert self.limit is not None
        while not self._closed:
            job = self._job
            if job is None:
                self._busy.clear()
                if self._job is None:  # not begun between the read and the clear
                    self._busy.wait()
                continue
            late = job.started + self.limit - time.monotonic()
            if late > 0:
                time.sleep(late)  # sleeps while busy only: at most one wake-up per `limit` seconds of jobs
                continue
            if self._job is job and self._stalled is not job:
                self._stalled = job
                self.stalls += 1
                ids = job.request_ids()
                logger.warning("the %s thread has been on one %s for %.1f s (watchdog %g s)", self.thread_name,
                               job.what, time.monotonic() - job.started, self.limit,
                               extra={"request_id": ",".join(ids) if ids else None})
            while self._job is job and not self._closed:  # until it ends, checked once per limit
                time.sleep(min(self.limit, 1.0))
            if self._stalled is job:
                logger.warning("the %s thread's %s ended after %.1f s", self.thread_name, job.what,
                               time.monotonic() - job.started)
