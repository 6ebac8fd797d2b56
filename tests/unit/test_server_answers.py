"""The server's own answers (api/protocol/health.py, models.py): /healthz, /readyz, /models/load and /models/unload,
with the keys docs/operations.md and docs/models.md name, optional ones only when they say something."""

from __future__ import annotations

from edge_llm.api.protocol import health
from edge_llm.api.protocol.models import model_loaded, model_unloaded


def test_liveness_says_degraded_with_the_reason_only_when_a_step_is_stuck() -> None:
    assert health.alive("ok", True, None) == {"status": "ok", "model_loaded": True}
    stuck = health.alive("ok", True, "engine step running 31 s")
    assert stuck == {"status": "degraded", "model_loaded": True, "reason": "engine step running 31 s"}
    assert list(stuck) == ["status", "model_loaded", "reason"]
    assert health.not_alive("engine thread died") == {"status": "engine thread died"}


def test_readiness_names_the_stall_when_degraded_and_the_models_in_many_models_mode() -> None:
    assert health.readiness("ready", "ignored unless degraded", None) == {"status": "ready"}
    assert health.readiness("degraded", "compile 40 s", None) == {"status": "degraded", "reason": "compile 40 s"}
    assert health.readiness("ready", None, {"a": "loaded", "b": "unloaded"}) == {
        "status": "ready", "models": {"a": "loaded", "b": "unloaded"}}


def test_model_load_and_unload_answers() -> None:
    assert model_loaded("m", "loaded", 12.5, "5m") == {"model": "m", "state": "loaded", "load_ms": 12.5,
                                                      "keep_alive": "5m"}
    assert model_unloaded("m", "unloaded", None) == {"model": "m", "state": "unloaded"}
    assert model_unloaded("m", "loaded", 2) == {"model": "m", "state": "loaded",
                                                "unload": "after its 2 requests in flight end"}
