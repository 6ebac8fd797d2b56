"""The engine-thread watchdog (issue 41): a decode step longer than --watchdog-seconds (here a whole long prompt
prefilled in one step, with a tiny limit) is reported while it runs: /readyz 503 "degraded" naming the request,
/healthz 200 "degraded", a warning line with the request id, edge_llm_watchdog_stalls_total; and all of it clears
when the step ends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.reliability.support import (
    COMPLETIONS,
    TIMEOUT,
    assert_no_unhandled_errors,
    assert_serving,
    metric,
    scrape,
    wait_for,
)

WATCHDOG_SECONDS = 0.3
REQUEST_ID = "watchdog-long-prefill"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("watchdog"), "--parallel", "1", "--ctx-size", "2048",
                    "--batch-size", "1024", "--cache-slots", "0",
                    "--watchdog-seconds", str(WATCHDOG_SECONDS)) as running:
        yield running
        assert_serving(running)
        assert_no_unhandled_errors(running)


def test_a_step_past_the_watchdog_makes_readyz_degraded_until_it_ends(server: RunningServer) -> None:
    before = metric(scrape(server), "edge_llm_watchdog_stalls_total")
    answers: list[httpx.Response] = []
    prompt = "the quick brown fox jumps over the lazy dog, " * 80  # about 800 tokens: one prefill step

    def long_prompt() -> None:
        answers.append(httpx.post(server.url + COMPLETIONS, json={"prompt": prompt, "max_tokens": 1},
                                  headers={"X-Request-Id": REQUEST_ID}, timeout=TIMEOUT))

    thread = threading.Thread(target=long_prompt)
    thread.start()
    seen: dict[str, dict[str, object]] = {}

    def degraded() -> bool:
        ready = httpx.get(server.url + "/readyz", timeout=30)
        if ready.status_code != 503:
            return False
        seen["readyz"] = ready.json()
        seen["healthz"] = {"code": (health := httpx.get(server.url + "/healthz", timeout=30)).status_code,
                           **health.json()}
        return True

    wait_for(degraded, TIMEOUT, "/readyz to turn 503 during the long step")
    thread.join(TIMEOUT)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    readyz = seen["readyz"]
    assert readyz["status"] == "degraded", readyz
    assert "engine thread" in str(readyz["reason"]) and REQUEST_ID in str(readyz["reason"]), readyz
    healthz = seen["healthz"]
    if healthz["status"] == "degraded":  # (the step may have ended between the two probes)
        assert healthz["code"] == 200 and REQUEST_ID in str(healthz["reason"]), healthz
    wait_for(lambda: httpx.get(server.url + "/readyz", timeout=30).status_code == 200, 60, "/readyz 200 again")
    assert httpx.get(server.url + "/healthz", timeout=30).json()["status"] == "ok"
    samples = scrape(server)
    assert metric(samples, "edge_llm_watchdog_stalls_total") >= before + 1
    assert metric(samples, "edge_llm_stalled_threads") == 0
    warnings = [json.loads(line) for line in server.log().splitlines()
                if line.startswith("{") and "has been on one step" in line]
    assert any(record.get("request_id") == REQUEST_ID for record in warnings), warnings
