"""GET /v1/models and /v1/models/{id}: the one model this server serves, under each of its names."""

from __future__ import annotations

import logging
import time
from typing import Any

from edge_llm.api.protocol import ModelCard, ModelList
from edge_llm.api.serving.base import Serving
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient

logger = logging.getLogger(__name__)


class ModelServing(Serving):
    def __init__(self, settings: Settings, engine: EngineClient) -> None:
        super().__init__(settings, engine)
        self.created = int(time.time())

    def list_models(self) -> ModelList:
        return ModelList(data=[self.model_card()])

    def get_model(self, name: str) -> ModelCard:
        self.check_model(name)
        return self.model_card()

    def model_card(self) -> ModelCard:
        meta: dict[str, Any] = {"n_ctx": self.settings.ctx_size, "path": str(self.settings.model)}
        if self.settings.model_alias:
            meta["alias"] = self.settings.model_alias
        info = self.engine.model_info
        if info is not None:
            meta.update(n_params=info.n_params, size=info.size_bytes, n_ctx_train=info.n_ctx_train,
                        n_vocab=info.n_vocab, description=info.description)
        return ModelCard(id=self.model_id, created=self.created, meta=meta)
