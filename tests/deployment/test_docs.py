"""docs/deployment.md shows the files the tests run (so they cannot drift apart), names only metrics the server
exports, and the systemd unit waits longer than the drain."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from edge_llm.api.metrics import Metrics, ServedModel, ServerState
from edge_llm.config import Settings
from edge_llm.engine.types import EngineStats

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deployment.md"
UNIT = REPO / "deploy" / "systemd" / "edge-llm.service"


def test_the_doc_shows_the_shipped_nginx_config_and_unit_verbatim() -> None:
    doc = DOC.read_text()
    for path in (REPO / "deploy" / "nginx" / "edge-llm.conf", UNIT):
        assert path.read_text() in doc, f"{path.relative_to(REPO)} differs from what docs/deployment.md shows"


def exported_names() -> set[str]:
    metrics = Metrics()
    stats = EngineStats(waiting=0, running=0, cached_sequences=0, kv_cells_used=0, kv_cells_total=16,
                        evictions={"cache_slots": 0})
    metrics.watch(lambda: [(ServedModel("m", prefix_caching=True), stats)], lambda: ServerState(True, True, False, 0))
    metrics.http_requests.labels("/v1/models", "GET", "200").inc()  # labelled families show once they have a child
    metrics.http_duration.labels("/v1/models").observe(0.1)
    families = list(text_string_to_metric_families(metrics.exposition()[0].decode()))
    return {family.name for family in families} | {sample.name for family in families for sample in family.samples}


def test_the_doc_names_only_exported_metrics() -> None:
    named = set(re.findall(r"\b(?:edge_llm_[a-z_]+[a-z]|vllm:[a-z_]+[a-z])\b", DOC.read_text()))
    assert len(named) > 10
    assert not named - exported_names()


def test_the_unit_outwaits_the_drain() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert int(service["TimeoutStopSec"]) > Settings.model_fields["drain_timeout"].default
    assert service["ExecStart"].split()[1:] == ["serve"]


def test_the_readme_links_the_deployment_guide() -> None:
    assert "docs/deployment.md" in (REPO / "README.md").read_text()
