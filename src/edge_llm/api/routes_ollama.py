"""Ollama's API (/api/*): thin routes to the Ollama serving objects. Errors leave in Ollama's envelope,
`{"error": "…"}` (api/errors.py chooses it by path)."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import APIError
from edge_llm.api.model_routing import keep_alive_of, unknown_model, with_model
from edge_llm.api.protocol.errors import OllamaErrorResponse
from edge_llm.api.protocol.ollama import (
    OllamaChatResponse,
    OllamaEmbeddingsResponse,
    OllamaEmbedResponse,
    OllamaGenerateResponse,
)
from edge_llm.api.routes import _json_body as json_body
from edge_llm.api.serving.body import request_json
from edge_llm.api.serving.ollama import OllamaServing, unload
from edge_llm.api.serving.ollama_embed import OllamaEmbedServing
from edge_llm.api.serving.ollama_models import OllamaModelServing
from edge_llm.api.serving.ollama_pull import PullServing
from edge_llm.registry.registry import ModelRegistry, UnknownModelError

ollama_router = APIRouter(tags=["Ollama"])
_PROBE = {"include_in_schema": False}  # HEAD: Ollama's clients probe with it; the document lists the GET

_ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": OllamaErrorResponse} for status in (400, 401, 404, 413,
                                                                                                  503)}
_STREAMED = {**_ERRORS, 200: {"content": {"application/x-ndjson": {}}}}


# ---- generation ------------------------------------------------------------------------------------------------


@ollama_router.post("/api/chat", response_model=OllamaChatResponse, responses=_STREAMED,
                    openapi_extra=json_body("OllamaChatRequest"),
                    summary="Ollama: the next chat message, streamed as NDJSON unless `stream: false`")
async def ollama_chat(request: Request) -> Response:
    return await _generation(request, "messages", lambda serving: serving.chat(request))


@ollama_router.post("/api/generate", response_model=OllamaGenerateResponse, responses=_STREAMED,
                    openapi_extra=json_body("OllamaGenerateRequest"),
                    summary="Ollama: a completion of `prompt` (templated, raw, or fill-in-the-middle with `suffix`)")
async def ollama_generate(request: Request) -> Response:
    return await _generation(request, "prompt", lambda serving: serving.generate(request))


@ollama_router.post("/api/embed", response_model=OllamaEmbedResponse, responses=_ERRORS,
                    openapi_extra=json_body("OllamaEmbedRequest"), summary="Ollama: embeddings of one or more inputs")
async def ollama_embed(request: Request) -> Response:
    return await with_model(request, OllamaEmbedServing, lambda serving: serving.ollama_embed(request))


@ollama_router.post("/api/embeddings", response_model=OllamaEmbeddingsResponse, responses=_ERRORS,
                    openapi_extra=json_body("OllamaEmbeddingsRequest"),
                    summary="Ollama: the embedding of one prompt (superseded by /api/embed)")
async def ollama_embeddings(request: Request) -> Response:
    return await with_model(request, OllamaEmbedServing, lambda serving: serving.ollama_embeddings(request))


async def _generation(request: Request, content: str, handler: Any) -> Response:
    """A request without `content` (messages, prompt) and with keep_alive 0 unloads its model without loading it,
    as Ollama does; every other one is served by the model it names."""
    try:
        body = await request_json(request)
    except APIError:
        body = {}  # the serving object refuses the body with the same 400
    if body and not body.get(content) and keep_alive_of(body) == 0:
        name = body.get("model")
        try:
            answer = await unload(cast(ModelRegistry, request.app.state.registry),
                                  name if isinstance(name, str) and name else None, chat=content == "messages")
        except UnknownModelError as exc:
            raise unknown_model(exc) from None
        return JSONResponse(answer)
    return await with_model(request, OllamaServing, handler)


def _models(request: Request) -> OllamaModelServing:
    return cast(OllamaModelServing, request.app.state.ollama_models)


# ---- model management ------------------------------------------------------------------------------------------


@ollama_router.head("/api/tags", **_PROBE)
@ollama_router.get("/api/tags", summary="Ollama: every model the server can serve")
async def ollama_tags(request: Request) -> JSONResponse:
    return JSONResponse(await _models(request).tags())


@ollama_router.post("/api/show", openapi_extra=json_body("OllamaShowRequest"), summary="Ollama: a model's details, GGUF facts, template and capabilities")
async def ollama_show(request: Request) -> JSONResponse:
    return JSONResponse(await _models(request).show(request))


@ollama_router.get("/api/ps", summary="Ollama: the loaded models, their memory and when they unload")
async def ollama_ps(request: Request) -> JSONResponse:
    return JSONResponse(await _models(request).ps())


@ollama_router.head("/api/version", **_PROBE)
@ollama_router.get("/api/version", summary="Ollama: the Ollama API version spoken")
async def ollama_version(request: Request) -> JSONResponse:
    return JSONResponse(_models(request).version())


@ollama_router.post("/api/pull", openapi_extra=json_body("OllamaPullRequest"), summary="Ollama: fetch a catalogue model, progress as NDJSON status lines")
async def ollama_pull(request: Request) -> Response:
    return await cast(PullServing, request.app.state.ollama_pull).pull(request)


@ollama_router.delete("/api/delete", openapi_extra=json_body("OllamaDeleteRequest"), summary="Ollama: forget a copied name, or delete a fetched catalogue model")
async def ollama_delete(request: Request) -> Response:
    await _models(request).delete(request)
    return Response(status_code=200)


@ollama_router.post("/api/copy", openapi_extra=json_body("OllamaCopyRequest"), summary="Ollama: another name for a model, for the server's lifetime")
async def ollama_copy(request: Request) -> Response:
    await _models(request).copy(request)
    return Response(status_code=200)


# Not in the OpenAPI document: a route that always answers 501 is no operation of this API (docs/api/index.md
# lists them).
@ollama_router.post("/api/create", include_in_schema=False)
async def ollama_create(request: Request) -> Response:
    raise OllamaModelServing.not_offered("Creating a model (/api/create)")


@ollama_router.post("/api/push", include_in_schema=False)
async def ollama_push(request: Request) -> Response:
    raise OllamaModelServing.not_offered("Pushing a model to a registry (/api/push)")
