"""Routes: thin, they only dispatch to the serving layer reached through app.state."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from edge_llm.api.serving import ChatService

router = APIRouter()

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 503)}


def _json_body(*models: str) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its JSON itself (for its own error envelope)."""
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _service(request: Request) -> ChatService:
    return request.app.state.chat_service


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("ChatCompletionRequest", "SimplePromptRequest"),
    summary="Chat completion (OpenAI body) or plain-text SSE stream (simple `prompt` body)",
)
async def chat_completions(request: Request) -> Response:
    return await _service(request).chat_completions(request)


@router.post(
    "/v1/completions",
    response_model=Completion,
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("CompletionRequest"),
    summary="Legacy text completion: the prompt is raw text (no chat template)",
)
async def completions(request: Request) -> Response:
    return await _service(request).completions(request)


@router.post(
    "/tokenize",
    responses=_ERRORS,
    openapi_extra=_json_body("TokenizeRequest"),
    summary="Text → token ids with the loaded model's vocabulary",
)
async def tokenize(request: Request) -> Response:
    return await _service(request).tokenize(request)


@router.post(
    "/detokenize",
    responses=_ERRORS,
    openapi_extra=_json_body("DetokenizeRequest"),
    summary="Token ids → text",
)
async def detokenize(request: Request) -> Response:
    return await _service(request).detokenize(request)


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    return _service(request).list_models()


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses={404: {"model": ErrorResponse}})
async def get_model(model_id: str, request: Request) -> ModelCard:
    service = _service(request)
    service.check_model(model_id)
    return service.list_models().data[0]


@router.get("/healthz", summary="Liveness: 200 while the process and the engine thread are alive")
async def healthz(request: Request) -> JSONResponse:
    engine = request.app.state.engine
    if engine.alive:
        return JSONResponse({"status": "ok", "model_loaded": engine.runner is not None})
    return JSONResponse({"status": "engine_dead" if engine.failure else "stopped"}, status_code=503)


@router.get("/readyz", summary="Readiness: 200 when loaded and accepting work, else 503 with the reason")
async def readyz(request: Request) -> JSONResponse:
    ready, status = request.app.state.lifecycle.readiness()
    return JSONResponse({"status": status}, status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)


# Included only with --test-hooks (EDGE_LLM_TEST_HOOKS=1): never in production.
debug_router = APIRouter(include_in_schema=False)


@debug_router.post("/debug/kill-engine")
async def kill_engine(request: Request) -> JSONResponse:
    request.app.state.engine.kill_for_test()
    return JSONResponse({"status": "killing the engine thread"}, status_code=202)


# The OpenAPI document lists the request schemas even though the route reads the body itself.
__all__ = ["router", "debug_router", "ChatCompletionRequest"]
