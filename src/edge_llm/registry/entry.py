"""A served model's state in the registry (`ModelEntry`), and the registry's errors."""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.facade import EngineClient
from edge_llm.registry.specs import ModelSpec


class ModelState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"


class UnknownModelError(LookupError):
    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.available = available


class ModelUnavailableError(Exception):
    """The model cannot serve this request now (503): it failed to load, it does not fit, or the server stops."""

    def __init__(self, message: str, *, code: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class KeepAliveDefault:
    """The marker for "this request gave no keep_alive": the server's default applies."""


DEFAULT_KEEP_ALIVE = KeepAliveDefault()


@dataclass(eq=False)
class ModelEntry:
    spec: ModelSpec
    keep_alive: float | None  # seconds to stay loaded after the last lease; None: never unloaded for idleness
    state: ModelState = ModelState.UNLOADED
    client: EngineClient | None = None  # from the start of its load to the end of its unload
    leases: int = 0  # requests being served
    waiters: int = 0  # requests waiting for it (to load, or for room)
    last_used: float = 0.0  # monotonic: the last lease's end, or the load
    loaded_at: float | None = None  # wall-clock time of the last load
    load_seconds: float | None = None
    error: str | None = None  # why the last load failed
    unload_when_idle: bool = False  # POST /models/unload of a busy model
    task: asyncio.Task[None] | None = None  # the load or the unload in progress
    timer: asyncio.TimerHandle | None = None  # the keep_alive expiry
    loads: int = 0
    unloads: Counter[str] = field(default_factory=Counter)  # by reason: idle, keep_alive, evicted, request
    attachments: dict[str, Any] = field(default_factory=dict)  # what the API keeps per loaded engine
    copies: list[str] = field(default_factory=list)  # names given by Ollama's /api/copy (for the server's lifetime)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may use for it (registry/names.py also reads Ollama's spellings of them)."""
        return self.spec.names + tuple(self.copies)

    @property
    def pinned(self) -> bool:
        return self.spec.pinned or self.keep_alive is None

    @property
    def holds_memory(self) -> bool:
        return self.state is not ModelState.UNLOADED
