"""Routes: thin, they only dispatch to the endpoint family's serving object for the model the request names
(api/model_routing.py), or to the model registry's (/v1/models, load, unload, health)."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import APIError
from edge_llm.api.protocol import health
from edge_llm.api.protocol.errors import AnthropicErrorResponse, ErrorResponse
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest
from edge_llm.api.protocol.openai_answers import ChatCompletion, Completion
from edge_llm.api.protocol.models import (
    AnthropicModelInfo,
    AnthropicModelList,
    ModelCard,
    ModelList,
    anthropic_model,
    anthropic_models,
    speaks_anthropic_models,
)
from edge_llm.api.protocol.embeddings import EmbeddingsResponse
from edge_llm.api.model_routing import with_model
from edge_llm.api.serving import (
    ChatServing,
    CompletionServing,
    EmbeddingServing,
    InfillServing,
    NativeServing,
    ResponsesServing,
    TokenizationServing,
)
from edge_llm.api.serving import background_responses, stored_responses
from edge_llm.api.serving.models import ModelServing
from edge_llm.registry.registry import ModelRegistry

router = APIRouter()

_ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 503)}


def _json_body(*models: str) -> dict[str, Any]:
    """The OpenAPI request body of a route that parses its JSON itself (for its own error envelope)."""
    refs = [{"$ref": f"#/components/schemas/{name}"} for name in models]
    schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _models(request: Request) -> ModelServing:
    return cast(ModelServing, request.app.state.models)


def _registry(request: Request) -> ModelRegistry:
    return cast(ModelRegistry, request.app.state.registry)


# Clients whose base URL lacks /v1 (and tools written for llama-server) call the OpenAI routes without it.
_UNVERSIONED = {"include_in_schema": False}


@router.post("/chat/completions", **_UNVERSIONED)
@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("ChatCompletionRequest", "SimplePromptRequest"),
    summary="Chat completion (OpenAI body) or plain-text SSE stream (simple `prompt` body)",
)
async def chat_completions(request: Request) -> Response:
    return await with_model(request, ChatServing, lambda serving: serving.chat_completions(request))


@router.post("/completions", **_UNVERSIONED)
@router.post(
    "/v1/completions",
    response_model=Completion,
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("CompletionRequest"),
    summary="Legacy text completion: the prompt is raw text (no chat template)",
)
async def completions(request: Request) -> Response:
    return await with_model(request, CompletionServing, lambda serving: serving.completions(request))


@router.post(
    "/infill",
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("InfillRequest"),
    summary="Fill-in-the-middle for editors, llama-server's /infill (llama.vscode, llama.vim)",
)
async def infill(request: Request) -> Response:
    return await with_model(request, InfillServing, lambda serving: serving.infill(request))


@router.post(
    "/completion",
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("NativeCompletionRequest"),
    summary="llama-server's /completion: a raw prompt (text, token ids or both), its answer and stream",
)
async def native_completion(request: Request) -> Response:
    return await with_model(request, NativeServing, lambda serving: serving.completion(request))


@router.post(
    "/apply-template",
    responses=_ERRORS,
    openapi_extra=_json_body("ChatCompletionRequest"),
    summary="llama-server's /apply-template: the chat template applied to `messages`, as the prompt's text",
)
async def apply_template(request: Request) -> Response:
    return await with_model(request, NativeServing, lambda serving: serving.apply_template(request))


@router.get("/props", summary="llama-server's /props: the model, its context, template and default settings")
async def props(request: Request) -> Response:
    return await with_model(request, NativeServing, lambda serving: _answer(dict(serving.props())))


@router.get("/slots", include_in_schema=False)  # not offered: always 501, as llama-server answers without --slots
async def slots(request: Request) -> Response:
    raise APIError(501, "This server does not support slots endpoint: it runs sequences in one continuous batch, "
                   "not in fixed slots (the figures are in /metrics)", code="not_supported")


async def _answer(content: dict[str, Any]) -> Response:
    return JSONResponse(content)


@router.post("/embeddings", **_UNVERSIONED)
@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    responses=_ERRORS,
    openapi_extra=_json_body("EmbeddingsRequest"),
    summary="Embeddings: one normalised vector per input, pooled from the served model's hidden states",
)
async def embeddings(request: Request) -> Response:
    return await with_model(request, EmbeddingServing, lambda serving: serving.embeddings(request))


@router.post(
    "/tokenize",
    responses=_ERRORS,
    openapi_extra=_json_body("TokenizeRequest"),
    summary="Text → token ids with the loaded model's vocabulary",
)
async def tokenize(request: Request) -> Response:
    return await with_model(request, TokenizationServing, lambda serving: serving.tokenize(request))


@router.post(
    "/detokenize",
    responses=_ERRORS,
    openapi_extra=_json_body("DetokenizeRequest"),
    summary="Token ids → text",
)
async def detokenize(request: Request) -> Response:
    return await with_model(request, TokenizationServing, lambda serving: serving.detokenize(request))


@router.get("/models", response_model=ModelList | AnthropicModelList, **_UNVERSIONED)
@router.get("/v1/models", response_model=ModelList | AnthropicModelList,
            description="OpenAI's list; Anthropic's shape when the request carries `anthropic-version` or `x-api-key`")
async def list_models(request: Request) -> ModelList | AnthropicModelList:
    listing = _models(request).list_models()
    return anthropic_models(listing.data) if speaks_anthropic_models(request.headers) else listing


@router.get("/models/{model_id:path}", response_model=ModelCard | AnthropicModelInfo, **_UNVERSIONED)
@router.get("/v1/models/{model_id:path}", response_model=ModelCard | AnthropicModelInfo,
            responses={404: {"model": ErrorResponse}},
            description="OpenAI's card; Anthropic's shape when the request carries `anthropic-version` or `x-api-key`")
async def get_model(model_id: str, request: Request) -> ModelCard | AnthropicModelInfo:
    card = _models(request).get_model(model_id)
    return anthropic_model(card) if speaks_anthropic_models(request.headers) else card


@router.post("/models/load", responses=_ERRORS, openapi_extra=_json_body("ModelLoadRequest"),
             summary="Load a model now; it then stays loaded as keep_alive says")
async def load_model(request: Request) -> JSONResponse:
    return JSONResponse(await _models(request).load(request))


@router.post("/models/unload", responses=_ERRORS, openapi_extra=_json_body("ModelLoadRequest"),
             summary="Unload a model: now when idle, else when its requests end")
async def unload_model(request: Request) -> JSONResponse:
    return JSONResponse(await _models(request).unload(request))


@router.get("/health", include_in_schema=False)  # llama-server's name for it
@router.get("/healthz", summary="Liveness: 200 while the process and the loaded models' engine threads are alive")
async def healthz(request: Request) -> JSONResponse:
    registry = _registry(request)
    alive, status = registry.health()
    if alive:  # a stall: alive (not to be restarted) but slow, "degraded"; /readyz is 503 meanwhile
        return JSONResponse(health.alive(status, bool(registry.loaded_clients()), registry.stall()))
    return JSONResponse(health.not_alive(status), status_code=503)


@router.get("/readyz", summary="Readiness: 200 when the server accepts work, else 503 with the reason")
async def readyz(request: Request) -> JSONResponse:
    ready, status = request.app.state.lifecycle.readiness()
    registry = _registry(request)
    models = {entry.name: entry.state.value for entry in registry.entries} if registry.on_demand else None
    body = health.readiness(status, registry.stall() if status == "degraded" else None, models)
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    metrics = request.app.state.metrics
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type, headers={"Process-Start-Time-Unix": str(metrics.started_unix)})


# The OpenAPI document lists the request schemas even though the route reads the body itself.
__all__ = ["router", "ChatCompletionRequest"]


@router.post("/responses", **_UNVERSIONED)
@router.post(
    "/v1/responses",
    responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("ResponsesRequest"),
    summary="OpenAI Responses API: input items, previous_response_id, function tools, text.format, its event stream",
)
async def responses(request: Request) -> Response:
    return await with_model(request, ResponsesServing, lambda serving: serving.responses(request))


@router.get("/responses/{response_id}", **_UNVERSIONED)
@router.get("/v1/responses/{response_id}", responses={404: {"model": ErrorResponse}},
            summary="A stored response (kept unless the request said `store: false`)")
async def get_response(response_id: str, request: Request) -> Response:
    return stored_responses.retrieve(request, response_id)


@router.delete("/responses/{response_id}", **_UNVERSIONED)
@router.delete("/v1/responses/{response_id}", responses={404: {"model": ErrorResponse}},
               summary="Forget a stored response")
async def delete_response(response_id: str, request: Request) -> Response:
    return stored_responses.delete(request, response_id)


@router.post("/responses/{response_id}/cancel", **_UNVERSIONED)
@router.post("/v1/responses/{response_id}/cancel", responses={400: {"model": ErrorResponse},
                                                             404: {"model": ErrorResponse}},
             summary="Cancel a background response: its generation stops and its status becomes cancelled")
async def cancel_response(response_id: str, request: Request) -> Response:
    return background_responses.cancel(request, response_id)


@router.get("/responses/{response_id}/input_items", **_UNVERSIONED)
@router.get("/v1/responses/{response_id}/input_items", responses={400: {"model": ErrorResponse},
                                                                  404: {"model": ErrorResponse}},
            summary="The input a stored response answered (earlier turns' items included), OpenAI's list")
async def response_input_items(response_id: str, request: Request) -> Response:
    return stored_responses.input_items(request, response_id)


# ---- Anthropic's Messages API (errors in Anthropic's envelope: api/errors.py chooses it by path) ----------------

from edge_llm.api.protocol.anthropic_answers import CountTokensResponse, MessageResponse  # noqa: E402
from edge_llm.api.serving.messages import MessagesServing  # noqa: E402

_ANTHROPIC_ERRORS = {status: {"model": AnthropicErrorResponse} for status in (400, 401, 404, 413, 503)}


@router.post(
    "/v1/messages",
    response_model=MessageResponse,
    responses={**_ANTHROPIC_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    openapi_extra=_json_body("MessagesRequest"),
    summary="Anthropic Messages API: content blocks, tools, Anthropic's SSE events and error envelope",
)
async def anthropic_messages(request: Request) -> Response:
    return await with_model(request, MessagesServing, lambda serving: serving.messages(request))


@router.post(
    "/v1/messages/count_tokens",
    response_model=CountTokensResponse,
    responses=_ANTHROPIC_ERRORS,
    openapi_extra=_json_body("CountTokensRequest"),
    summary="The prompt tokens a Messages request would have",
)
async def anthropic_count_tokens(request: Request) -> Response:
    return await with_model(request, MessagesServing, lambda serving: serving.count_tokens(request))
