"""The serving layer: one module per endpoint family, each a `Serving` subclass; `base` holds the steps they share,
`core` what one model's families share (one prompt builder, one grammar cache), `tool_calls` the tool-call tail.

A request goes route (api/routes.py) → the model it names (api/model_routing.py) → its family's serving object
for that model's engine → the engine facade (edge_llm.engine.facade). `models.ModelServing` (/v1/models, load,
unload) serves the model registry instead. A new endpoint family is a new module here, listed in `FAMILIES`, plus its
routes.
"""

from __future__ import annotations

from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.chat import ChatServing
from edge_llm.api.serving.completions import CompletionServing
from edge_llm.api.serving.core import ModelCore
from edge_llm.api.serving.embeddings import EmbeddingServing
from edge_llm.api.serving.infill import InfillServing
from edge_llm.api.serving.messages import MessagesServing
from edge_llm.api.serving.native import NativeServing
from edge_llm.api.serving.ollama import OllamaServing
from edge_llm.api.serving.ollama_embed import OllamaEmbedServing
from edge_llm.api.serving.responses import ResponsesServing
from edge_llm.api.serving.tokenization import TokenizationServing
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient
from edge_llm.prompting.builtin_templates import chosen_template

# The families served by one model's engine; ModelServing (/v1/models, load, unload) serves the registry.
FAMILIES: tuple[type[Serving], ...] = (ChatServing, MessagesServing, CompletionServing, InfillServing,
                                       EmbeddingServing, TokenizationServing, ResponsesServing, OllamaServing,
                                       OllamaEmbedServing, NativeServing)


def build_serving(settings: Settings, engine: EngineClient,
                  names: tuple[str, ...] = ()) -> dict[type[Serving], Serving]:
    """One serving object per endpoint family for one model's engine, by class (what the routes look up), all on
    the model's one core (its prompt builder and grammar cache)."""
    core = ModelCore(engine, settings.model_name, chosen_template(settings.chat_template, settings.chat_template_file))
    return {family: family(settings, engine, core, names) for family in FAMILIES}


__all__ = ["FAMILIES", "ChatServing", "CompletionServing", "EmbeddingServing", "InfillServing", "MessagesServing",
           "NativeServing", "OllamaEmbedServing", "OllamaServing", "ResponsesServing", "Serving", "TokenizationServing",
           "build_serving"]
