"""The model list (/v1/models) and the bodies and answers of /models/load and /models/unload. Errors use the server's one
error envelope."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, Field

from edge_llm.api.protocol.common import RequestModel


class ModelLoadRequest(RequestModel):
    """POST /models/load and /models/unload."""

    model: str = Field(min_length=1)
    keep_alive: str | float | None = None  # Ollama's: "5m", seconds, 0, -1 (load only)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edge-llm"
    state: Literal["loaded", "loading", "unloaded", "unloading"] | None = None  # the model's engine
    aliases: list[str] = Field(default_factory=list)  # other names a request may use for it
    tags: list[str] = Field(default_factory=list)  # --tags: labels, as llama-server's /v1/models shows them
    meta: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class AnthropicModelInfo(BaseModel):
    """A model as Anthropic's /v1/models describes one (the anthropic SDKs' ModelInfo)."""

    type: Literal["model"] = "model"
    id: str
    display_name: str
    created_at: str  # RFC 3339


class AnthropicModelList(BaseModel):
    data: list[AnthropicModelInfo]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


def speaks_anthropic_models(headers: Mapping[str, str]) -> bool:
    """A model listing asked for by an Anthropic client: the SDKs send `anthropic-version` (and `x-api-key`)."""
    return "anthropic-version" in headers or "x-api-key" in headers


def anthropic_models(cards: list[ModelCard]) -> AnthropicModelList:
    infos = [anthropic_model(card) for card in cards]
    return AnthropicModelList(data=infos, first_id=infos[0].id if infos else None,
                              last_id=infos[-1].id if infos else None)


def anthropic_model(card: ModelCard) -> AnthropicModelInfo:
    created = datetime.fromtimestamp(card.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return AnthropicModelInfo(id=card.id, display_name=card.id, created_at=created)


class ModelLoaded(TypedDict):
    """POST /models/load's answer."""

    model: str
    state: str
    load_ms: float
    keep_alive: str


class ModelUnloaded(TypedDict):
    """POST /models/unload's answer; `unload` says when, while requests in flight keep it loaded."""

    model: str
    state: str
    unload: NotRequired[str]


def model_loaded(name: str, state: str, load_ms: float, keep_alive: str) -> ModelLoaded:
    return {"model": name, "state": state, "load_ms": load_ms, "keep_alive": keep_alive}


def model_unloaded(name: str, state: str, leases: int | None) -> ModelUnloaded:
    """`leases`: the requests in flight it waits for, None when it is unloaded already."""
    answer: ModelUnloaded = {"model": name, "state": state}
    if leases is not None:
        answer["unload"] = f"after its {leases} requests in flight end"
    return answer
