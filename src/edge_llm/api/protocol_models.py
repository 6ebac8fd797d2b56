"""The model list (/v1/models) and the bodies of /models/load and /models/unload. Errors use the server's one
error envelope."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from edge_llm.api.protocol_base import RequestModel


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
    meta: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
