"""The app factory: routes, error handlers, middleware, and a lifespan that runs the engine thread."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from edge_llm import __version__
from edge_llm.api.errors import register_error_handlers
from edge_llm.api.middleware import BodySizeLimit
from edge_llm.api.protocol import ChatCompletionRequest, SimplePromptRequest
from edge_llm.api.routes import router
from edge_llm.api.serving import ChatService
from edge_llm.config import Settings
from edge_llm.engine.worker import Engine

logger = logging.getLogger(__name__)


def _terminate_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own handler then shuts down cleanly


def create_app(
    settings: Settings, engine: Engine, *, on_fatal: Callable[[], None] = _terminate_process
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        app.state.exit_code = 0

        def engine_exited(error: BaseException | None) -> None:
            if error is not None and app.state.exit_code == 0:
                app.state.exit_code = 1
                logger.error("edge-llm: %s", _one_line(error))
                loop.call_soon_threadsafe(on_fatal)

        engine.set_exit_handler(engine_exited)
        engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)
            app.state.chat_service.close()

    app = FastAPI(title="Edge LLM Engine", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.chat_service = ChatService(settings, engine)
    app.include_router(router)
    register_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    _document_request_schemas(app)
    return app


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _document_request_schemas(app: FastAPI) -> None:
    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = original()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, SimplePromptRequest):
                definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(definition.pop("$defs", {}))
                components[model.__name__] = definition
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
