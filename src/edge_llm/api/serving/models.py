"""GET /v1/models and /v1/models/{id}: every served model, its state and facts; POST /models/load and
/models/unload. This family serves the model registry, not one model's engine."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Request

from edge_llm.api.model_routing import keep_alive_of, unavailable, unknown_model
from edge_llm.api.params import parse_body
from edge_llm.api.request_context import request_context
from edge_llm.api.protocol.models import (ModelCard, ModelList, ModelLoaded, ModelLoadRequest, ModelUnloaded,
                                          model_loaded, model_unloaded)
from edge_llm.api.serving.body import request_json
from edge_llm.config import Settings
from edge_llm.registry.keep_alive import describe_keep_alive
from edge_llm.registry.registry import (
    ModelEntry,
    ModelRegistry,
    ModelState,
    ModelUnavailableError,
    UnknownModelError,
)

logger = logging.getLogger(__name__)


class ModelServing:
    def __init__(self, settings: Settings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.created = int(time.time())

    def list_models(self) -> ModelList:
        return ModelList(data=[self.model_card(entry) for entry in self.registry.entries])

    def get_model(self, name: str) -> ModelCard:
        return self.model_card(self._entry(name))

    async def load(self, request: Request) -> ModelLoaded:
        name, keep_alive = await self._body(request)
        started = time.monotonic()
        try:
            entry = await self.registry.load(name, keep_alive)
        except UnknownModelError as exc:
            raise unknown_model(exc) from None
        except ModelUnavailableError as exc:
            raise unavailable(exc) from None
        return model_loaded(entry.name, entry.state.value, round((time.monotonic() - started) * 1000, 2),
                            self._keep_alive(entry))

    async def unload(self, request: Request) -> ModelUnloaded:
        name, _ = await self._body(request)
        try:
            entry = await self.registry.unload(name)
        except UnknownModelError as exc:
            raise unknown_model(exc) from None
        return model_unloaded(entry.name, entry.state.value,
                              entry.leases if entry.state is ModelState.LOADED else None)

    async def _body(self, request: Request) -> tuple[str, Any]:
        body = await request_json(request)
        parsed = parse_body(request_context(request), ModelLoadRequest, body, strict=self.settings.strict_params)
        return parsed.model, keep_alive_of(body)

    def _entry(self, name: str) -> ModelEntry:
        try:
            return self.registry.resolve(name)
        except UnknownModelError as exc:
            raise unknown_model(exc) from None

    @staticmethod
    def _keep_alive(entry: ModelEntry) -> str:
        return "pinned (--pin)" if entry.spec.pinned else describe_keep_alive(entry.keep_alive)

    def model_card(self, entry: ModelEntry) -> ModelCard:
        spec = entry.spec
        meta: dict[str, Any] = {"n_ctx": self.settings.sequence_context, "path": str(spec.path)}
        meta.update({key: value for key, value in spec.facts.items() if value is not None})
        meta.update(keep_alive=self._keep_alive(entry), requests_in_flight=entry.leases)
        if self.settings.alias_names and set(self.settings.alias_names) <= set(spec.names):
            meta["alias"] = self.settings.alias_names[0]
        if entry.loaded_at is not None:
            meta.update(loaded_at=int(entry.loaded_at), load_seconds=round(entry.load_seconds or 0.0, 2))
        if entry.error is not None:
            meta["load_error"] = entry.error
        info = entry.client.model_info if entry.client is not None and entry.state is ModelState.LOADED else None
        if info is not None:
            meta.update(n_params=info.n_params, size=info.size_bytes, n_ctx_train=info.n_ctx_train,
                        n_vocab=info.n_vocab, description=info.description)
        return ModelCard(id=spec.name, created=self.created, state=entry.state.value, aliases=list(spec.aliases),
                         tags=list(spec.tags), meta=meta)
