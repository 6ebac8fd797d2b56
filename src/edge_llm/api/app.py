"""The app factory: routes, error handlers, middleware, and a lifespan that runs the model registry (one engine
per loaded model, each reached only through its facade, `EngineClient`).

Middleware, outermost first: RequestTracking (request id, access log, metrics, send timeout; outside
even Starlette's error middleware) → HeaderLimit → HostGuard → CORS (with --cors-origins) →
ApiKeyAuth (with keys) → ShutdownGate → BodySizeLimit → routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp

from edge_llm import __version__
from edge_llm.api.errors import register_error_handlers
from edge_llm.api.lifecycle import Lifecycle
from edge_llm.api.middleware import BodySizeLimit, HeaderLimit, RequestTracking, ShutdownGate
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest, SimplePromptRequest
from edge_llm.api.protocol.openai_completions import CompletionRequest
from edge_llm.api.protocol.models import ModelLoadRequest
from edge_llm.api.protocol.ollama_models import CopyRequest, DeleteRequest, PullRequest, ShowRequest
from edge_llm.api.protocol.tokenization import DetokenizeRequest, TokenizeRequest
from edge_llm.api.protocol.llama_server import InfillRequest, NativeCompletionRequest
from edge_llm.api.protocol.responses import ResponsesRequest
from edge_llm.api.protocol.embeddings import EmbeddingsRequest
from edge_llm.api.protocol.anthropic import CountTokensRequest, MessagesRequest
from edge_llm.api.protocol.ollama import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
)
from edge_llm.api.response_store import ResponseStore, ResponseStoreCollector
from edge_llm.api.serving.background_responses import BackgroundRuns
from edge_llm.api.routes import router
from edge_llm.api.routes_ollama import ollama_router
from edge_llm.api.security import (
    ApiKeyAuth,
    HostGuard,
    LocalhostAwareCORS,
    allows_localhost,
    load_api_keys,
    warn_if_exposed,
)
from edge_llm.api.serving.models import ModelServing
from edge_llm.api.serving.ollama_models import OllamaModelServing
from edge_llm.api.serving.ollama_pull import PullServing
from edge_llm.api.telemetry import EngineTelemetry, RequestRecords
from edge_llm.api.web import web_router
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient
from edge_llm.api.metrics import Metrics, ModelSample, ServedModel, ServerState
from edge_llm.registry.registry import ModelRegistry, ModelState

logger = logging.getLogger(__name__)

_FATAL_GRACE = 5.0  # seconds for in-flight requests to receive their error once the engine died


class EdgeApp(FastAPI):
    """FastAPI with `RequestTracking` wrapped around the whole middleware stack."""

    def build_middleware_stack(self) -> ASGIApp:
        state = self.state
        return RequestTracking(
            super().build_middleware_stack(),
            metrics=state.metrics,
            records=state.records,
            lifecycle=state.lifecycle,
            routes=self.router.routes,
            send_timeout=state.settings.stream_idle_timeout,
            log_prompts=state.settings.log_prompts,
            max_body_bytes=state.settings.max_body_bytes,
        )


def create_app(
    settings: Settings, engine: EngineClient | None = None, *, registry: ModelRegistry | None = None,
    on_fatal: Callable[[], None] | None = None,
) -> FastAPI:
    """Serves the models of `registry`, or the one model of `engine` (already made, not started). `on_fatal`
    runs on the event loop when a serving engine thread dies (default: drain briefly, then exit). Raises ValueError
    for an unusable API key file."""
    if registry is None:
        if engine is None:
            raise TypeError("create_app needs an engine or a registry")
        registry = _one_engine_registry(settings, engine)
    api_keys = load_api_keys(settings)
    metrics = Metrics()
    records = RequestRecords()
    lifecycle = Lifecycle(registry, settings.drain_timeout)
    registry.prepare = lambda spec, client: client.set_observer(EngineTelemetry(metrics, records, spec.name))
    registry.on_loaded = lambda name, seconds: metrics.model_load.labels(name).observe(seconds)
    prefix_caching = settings.cache_slots > 0
    metrics.watch(lambda: [(ServedModel(name, prefix_caching), client.stats())
                           for name, client in registry.loaded_clients()],
                  lambda: ServerState(registry.health()[0], lifecycle.readiness()[0], lifecycle.draining,
                                      lifecycle.in_flight))
    metrics.watch_models(lambda: _model_samples(registry))

    def fatal() -> None:
        lifecycle.shutdown("the engine stopped", grace=_FATAL_GRACE)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.exit_code = 0

        def engine_died(error: BaseException) -> None:  # on the event loop
            if app.state.exit_code == 0:
                app.state.exit_code = 1
                logger.error("edge-llm: %s", _one_line(error))
                (on_fatal or fatal)()

        registry.on_fatal = engine_died
        registry.start()
        warn_if_exposed(settings, api_keys)
        try:
            yield
        finally:
            # Each engine: its tokenizer thread, then its engine thread (which frees the model): EngineClient.close.
            await asyncio.to_thread(registry.close)

    app = EdgeApp(title="Edge LLM Engine", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine  # the one engine given (tests); None when the registry makes them
    app.state.registry = registry
    app.state.models = ModelServing(settings, registry)  # /v1/models, load, unload
    app.state.ollama_models = OllamaModelServing(settings, registry)  # /api/tags, show, ps, delete, copy, version
    app.state.ollama_pull = PullServing(settings, registry, app.state.ollama_models.digests)  # /api/pull
    app.state.metrics = metrics
    app.state.response_store = ResponseStore(settings.responses_store_entries, settings.responses_store_bytes)
    metrics.registry.register(ResponseStoreCollector(app.state.response_store))
    app.state.background_runs = BackgroundRuns()  # background Responses running detached
    app.state.records = records
    app.state.lifecycle = lifecycle
    app.include_router(router)
    app.include_router(ollama_router)
    app.include_router(web_router)  # the web chat at / (no API key needed for the page itself)
    register_error_handlers(app)
    # add_middleware puts each one outside the ones added before it.
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ShutdownGate, lifecycle=lifecycle)
    if api_keys:
        app.add_middleware(ApiKeyAuth, keys=api_keys)
    if settings.cors_origins:
        app.add_middleware(
            LocalhostAwareCORS,
            allow_localhost=allows_localhost(settings.cors_origins),
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id", "X-Api-Key", "Anthropic-Version"],
            expose_headers=["X-Request-Id", "Retry-After"],
        )
    app.add_middleware(HostGuard, bind_host=settings.host, allowed_hosts=settings.allowed_hosts,
                       cors_origins=settings.cors_origins)
    app.add_middleware(HeaderLimit, max_headers=settings.max_headers, max_bytes=settings.max_header_bytes)
    _document_request_schemas(app)
    return app


def _one_engine_registry(settings: Settings, engine: EngineClient) -> ModelRegistry:
    from edge_llm.registry.setup import build_registry

    made: list[EngineClient] = []

    def the_engine(spec: object) -> EngineClient:
        if made:
            raise RuntimeError("this engine was given ready-made and cannot be loaded again")
        made.append(engine)
        return engine

    return build_registry(settings.model_copy(update={"models_dir": None}), the_engine)


def _model_samples(registry: ModelRegistry) -> list[ModelSample]:
    samples = []
    for entry in registry.entries:
        client = entry.client if entry.state is ModelState.LOADED else None
        samples.append(ModelSample(entry.name, entry.state.value, entry.spec.memory_bytes, entry.leases, entry.loads,
                                   dict(entry.unloads), client.stats() if client is not None else None))
    return samples


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _document_request_schemas(app: FastAPI) -> None:
    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = original()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, SimplePromptRequest, CompletionRequest, InfillRequest, NativeCompletionRequest,
                          TokenizeRequest, DetokenizeRequest, MessagesRequest, CountTokensRequest, ResponsesRequest,
                          EmbeddingsRequest, ModelLoadRequest, OllamaChatRequest, OllamaGenerateRequest,
                          OllamaEmbedRequest, OllamaEmbeddingsRequest):
                definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(definition.pop("$defs", {}))
                components[model.__name__] = definition
            for model in (ShowRequest, PullRequest, DeleteRequest, CopyRequest):  # Ollama's, named as such
                components["Ollama" + model.__name__] = model.model_json_schema()
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
