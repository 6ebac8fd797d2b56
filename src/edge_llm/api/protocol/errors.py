"""The error envelope of each family, as its clients read it: OpenAI's (also llama-server's and the server's own
routes), Anthropic's on /v1/messages, Ollama's on /api/*. Which one a request gets is decided in api/errors.py."""

from __future__ import annotations

from typing import Literal

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
