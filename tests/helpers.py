"""Small helpers that the integration and reliability suites share: request bodies, metrics, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server import RunningServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def chat_body(content: str = "Say hi.", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 2, **fields}


def scrape(server: RunningServer, headers: dict[str, str] | None = None) -> Samples:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    response = httpx.get(server.url + "/metrics", headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def total(samples: Samples, name: str) -> float:
    """The sum of a metric over all its label values."""
    return sum(value for (sample, _), value in samples.items() if sample == name)
