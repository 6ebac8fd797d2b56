"""The serving layer: one module per endpoint family, each a `Serving` subclass; `base` holds what they share.

A request goes route (api/routes.py) → its family's serving object → the engine facade
(edge_llm.engine.facade). A new endpoint family is a new module here, listed in `FAMILIES`, plus its routes.
"""

from __future__ import annotations

from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.chat import ChatServing
from edge_llm.api.serving.completions import CompletionServing
from edge_llm.api.serving.embeddings import EmbeddingServing
from edge_llm.api.serving.infill import InfillServing
from edge_llm.api.serving.messages import MessagesServing
from edge_llm.api.serving.models import ModelServing
from edge_llm.api.serving.responses import ResponsesServing
from edge_llm.api.serving.tokenization import TokenizationServing
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient

FAMILIES: tuple[type[Serving], ...] = (ChatServing, MessagesServing, CompletionServing, InfillServing,
                                       EmbeddingServing, TokenizationServing, ModelServing, ResponsesServing)


def build_serving(settings: Settings, engine: EngineClient) -> dict[type[Serving], Serving]:
    """One serving object per endpoint family, by class (what the routes look up)."""
    return {family: family(settings, engine) for family in FAMILIES}


__all__ = ["FAMILIES", "ChatServing", "CompletionServing", "EmbeddingServing", "InfillServing", "MessagesServing",
           "ModelServing", "ResponsesServing", "Serving", "TokenizationServing", "build_serving"]
