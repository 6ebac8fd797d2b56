"""The registry the settings describe: --model alone (one model, loaded at start, kept) or --models-dir (every
GGUF there, loaded on demand, unloaded after --keep-alive, within --memory-budget and --max-loaded-models)."""

from __future__ import annotations

from edge_llm.config import Settings
from edge_llm.registry.keep_alive import parse_keep_alive
from edge_llm.registry.registry import EngineFactory, ModelRegistry
from edge_llm.registry.specs import model_specs

ON_DEMAND_KEEP_ALIVE = 300.0  # Ollama's default: 5 minutes


def build_registry(settings: Settings, factory: EngineFactory, *, default_budget: int | None = None) -> ModelRegistry:
    """`default_budget`: the memory budget when --memory-budget is not set (the CLI passes what the start-up memory
    check finds available). Raises ModelSpecError for settings naming models that cannot be served."""
    specs = model_specs(settings)
    on_demand = settings.models_dir is not None
    if settings.keep_alive is not None:
        keep_alive = parse_keep_alive(settings.keep_alive)
    else:
        keep_alive = ON_DEMAND_KEEP_ALIVE if on_demand else None
    budget = int(settings.memory_budget) if settings.memory_budget else (default_budget if on_demand else None)
    return ModelRegistry(
        specs, factory, default_model=specs[0].name,  # model_specs puts the default first
        keep_alive=keep_alive, budget=budget,
        max_loaded=settings.max_loaded_models, wait_timeout=settings.load_wait_timeout, on_demand=on_demand,
    )
