"""The error envelope of each family, as its clients read it: OpenAI's (also llama-server's and the server's own
routes), Anthropic's on /v1/messages, Ollama's on /api/*. Which one a request gets is decided in api/errors.py.

The pydantic models document the routes (OpenAPI); what is sent, as an answer or as an error inside a stream (an
SSE `error` chunk, Anthropic's `event: error`, an Ollama `{"error"}` line), and what the connection guard writes on
the socket itself, is built by `openai_error`, `anthropic_error` and `ollama_error`, checked against the SDKs'
types in tests/unit/test_wire_shapes.py."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's envelope: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's envelope: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


class OllamaErrorResponse(BaseModel):
    """Ollama's envelope: `{"error": "…"}`."""

    error: str


# ---- what is sent -------------------------------------------------------------------------------


class OpenAIErrorObject(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(TypedDict):
    error: OpenAIErrorObject


def openai_error(message: str, kind: str, *, param: str | None = None, code: str | None = None) -> OpenAIErrorBody:
    """`{"error": {"message", "type", "param", "code"}}`, its nulls explicit as OpenAI sends them."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class AnthropicErrorCode(TypedDict):
    error_code: str


class AnthropicErrorObject(TypedDict):
    type: str
    message: str
    details: NotRequired[AnthropicErrorCode]  # the server's own code, where Anthropic puts its codes


class AnthropicErrorBody(TypedDict):
    type: Literal["error"]
    error: AnthropicErrorObject


def anthropic_error(kind: str, message: str, code: str | None = None) -> AnthropicErrorBody:
    error: AnthropicErrorObject = {"type": kind, "message": message}
    if code:
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error}


class OllamaErrorBody(TypedDict):
    error: str


def ollama_error(message: str) -> OllamaErrorBody:
    return {"error": message}
