"""engine/thread/watchdog.py: a job past the limit is reported once, named with its requests, until it ends."""

from __future__ import annotations

import logging

import pytest

from edge_llm.engine.thread.watchdog import Watchdog
from tests.helpers import wait_for


def test_a_job_past_the_limit_is_a_stall_until_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = Watchdog("engine", 0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="edge_llm.engine.thread.watchdog"):
            watchdog.begin("step", lambda: ["req-1", "req-2"])
            wait_for(lambda: watchdog.stall() is not None, 10, "the stall")
            stall = watchdog.stall()
            assert stall is not None and "engine thread" in stall and "req-1, req-2" in stall
            assert watchdog.stalls == 1
            watchdog.end()
            assert watchdog.stall() is None
            wait_for(lambda: any("ended after" in r.getMessage() for r in caplog.records), 10, "the end line")
        warning = next(r for r in caplog.records if "has been on one step" in r.getMessage())
        assert getattr(warning, "request_id") == "req-1,req-2"
        assert watchdog.stalls == 1  # reported once
    finally:
        watchdog.close()


def test_short_jobs_are_not_stalls() -> None:
    watchdog = Watchdog("tokenizer", 30)
    try:
        for _ in range(1000):
            watchdog.begin("tokenize", list)
            watchdog.end()
        assert watchdog.stall() is None and watchdog.stalls == 0
    finally:
        watchdog.close()


def test_no_limit_no_thread() -> None:
    watchdog = Watchdog("engine", 0)
    watchdog.begin("step", list)
    assert watchdog.limit is None and watchdog.stall() is None
    watchdog.end()
