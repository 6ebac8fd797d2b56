"""The server's own probes: /healthz (liveness, also at llama-server's /health) and /readyz (readiness)."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class Liveness(TypedDict):
    status: str  # "ok", "degraded" (alive but a step or compile is stuck), or why it is not alive
    model_loaded: NotRequired[bool]
    reason: NotRequired[str]  # what is stuck, when degraded


class Readiness(TypedDict):
    status: str
    reason: NotRequired[str | None]  # what is stuck, when degraded
    models: NotRequired[dict[str, str]]  # many-models mode: each model's state


def alive(status: str, model_loaded: bool, stall: str | None) -> Liveness:
    if stall is None:
        return {"status": status, "model_loaded": model_loaded}
    return {"status": "degraded", "model_loaded": model_loaded, "reason": stall}


def not_alive(status: str) -> Liveness:
    return {"status": status}


def readiness(status: str, stall: str | None, models: dict[str, str] | None) -> Readiness:
    body: Readiness = {"status": status}
    if status == "degraded":
        body["reason"] = stall
    if models is not None:
        body["models"] = models
    return body
