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

_OPENAI_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # queue full, engine unavailable, shutting down (with Retry-After)
    529: "overloaded_error",
}


def openai_error_type(status: int) -> str:
    """The `type` OpenAI's envelope carries for an HTTP status: a named one, else by class (any other 4xx is the
    request's fault, a 5xx the server's)."""
    return _OPENAI_TYPE_BY_STATUS.get(status) or ("server_error" if status >= 500 else "invalid_request_error")


def anthropic_error_type(status: int) -> str:
    """The `type` Anthropic's envelope carries for an HTTP status, as Anthropic's API names them."""
    return _ANTHROPIC_TYPE_BY_STATUS.get(status) or ("api_error" if status >= 500 else "invalid_request_error")



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
