"""Every error leaves the server in OpenAI's envelope, in Anthropic's on the Anthropic Messages routes, or in
Ollama's (`{"error": "…"}`) on Ollama's /api/* routes; the mapping lives here and only here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from edge_llm.api.protocol.errors import (
    AnthropicErrorBody,
    OpenAIErrorBody,
    anthropic_error,
    anthropic_error_type,
    ollama_error,
    openai_error,
    openai_error_type,
)
from edge_llm.api.request_context import scope_context
from edge_llm.prompting.chat_template import TemplateError
from edge_llm.engine.types import EngineUnavailableError, QueueFullError

logger = logging.getLogger(__name__)

# The routes whose clients (the anthropic SDKs, Claude Code) read Anthropic's envelope.
ANTHROPIC_PATH = "/v1/messages"


def speaks_anthropic(path: str | None) -> bool:
    return path is not None and (path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"))


# Ollama's API: its clients (the ollama packages, Open WebUI, Continue, Copilot) read `{"error": "…"}`.
OLLAMA_PREFIX = "/api/"


def speaks_ollama(path: str | None) -> bool:
    return path is not None and path.startswith(OLLAMA_PREFIX)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
        ollama_message: str | None = None,
    ) -> None:
        """`ollama_message`: the text Ollama's envelope carries instead of `message`, where Ollama's own text is
        what its clients look for (`model '…' not found`)."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.ollama_message = ollama_message
        self.code = code
        self.param = param
        self.error_type = error_type or openai_error_type(status)
        self.headers = headers

    def openai_body(self) -> OpenAIErrorBody:
        return openai_error(self.message, self.error_type, param=self.param, code=self.code)

    def anthropic_body(self) -> AnthropicErrorBody:
        """Anthropic's envelope; our own code rides in `details.error_code`, where Anthropic puts its codes."""
        return anthropic_error(anthropic_error_type(self.status), self.message, self.code)

    def response(self, path: str | None = None) -> JSONResponse:
        """The error as the route at `path` answers errors (OpenAI's envelope unless it is an Anthropic or an
        Ollama route)."""
        body: Any
        if speaks_anthropic(path):
            body = self.anthropic_body()
        elif speaks_ollama(path):
            body = ollama_error(self.ollama_message or self.message)
        else:
            body = self.openai_body()
        return ErrorJSONResponse(body, status_code=self.status, headers=self.headers, code=self.code)


class ErrorJSONResponse(JSONResponse):
    """An error's answer, which notes its code in the request's context as it is sent: the access line and the
    rejection metrics take the code from there, as data (never out of the body's JSON)."""

    def __init__(self, content: Any, *, status_code: int, headers: dict[str, str] | None, code: str | None) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self.code = code

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = scope_context(scope)
        if context is not None:
            context.note_error(self.code)
        await super().__call__(scope, receive, send)


def invalid_request(message: str, *, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def from_validation_errors(errors: Sequence[Any], *, skip_body_prefix: bool = True) -> APIError:
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "value_error"}
    location = [str(part) for part in first.get("loc", ())]
    if skip_body_prefix and location[:1] == ["body"]:
        location = location[1:]
    param = ".".join(location) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"The request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    message = str(first.get("msg", "invalid value"))
    return APIError(400, f"Invalid value for '{param}': {message}" if param else message, param=param,
                    code="invalid_value")


def from_pydantic(exc: ValidationError, body: Any = None) -> APIError:
    """The 400 for a body its model refused. With the `body`, the error named is the one that got deepest into it
    (of a union's branches, the one that matched furthest), at the path of its keys and indexes only: pydantic's
    location also holds the names of union branches (`content.str`), which mean nothing to a client."""
    errors = exc.errors(include_url=False, include_input=False)
    if body is None or not errors:
        return from_validation_errors(errors, skip_body_prefix=False)
    located = [(_body_path(body, error), error) for error in errors]
    deepest = max(len(path) for path, _ in located)
    chosen = [(path, error) for path, error in located if len(path) == deepest]
    path = chosen[0][0]
    messages = list(dict.fromkeys(str(error.get("msg", "invalid value")) for _, error in chosen))
    return from_validation_errors([{**chosen[0][1], "loc": tuple(path), "msg": ", or ".join(messages)}],
                                  skip_body_prefix=False)


def _body_path(body: Any, error: Any) -> list[str | int]:
    """The part of an error's location that names keys and indexes of the body."""
    location = list(error.get("loc", ()))
    path: list[str | int] = []
    node = body
    for position, part in enumerate(location):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif position == len(location) - 1 and error.get("type") == "missing":
            node = None  # the key that is missing
        else:
            continue  # a union branch's name
        path.append(part)
    return path


def from_engine_error(exc: Exception) -> APIError:
    if isinstance(exc, QueueFullError):
        return APIError(503, str(exc), code="queue_full", headers={"Retry-After": "1"})
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, TemplateError):
        return APIError(400, str(exc), code="chat_template_error", param="messages")
    raise exc


CLIENT_CLOSED_REQUEST = 499


def register_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_errors(exc.errors()).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "HTTP error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return APIError(exc.status_code, message, code=code,
                        headers=getattr(exc, "headers", None)).response(request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, exc: ClientDisconnect) -> Response:
        # nginx's 499: the client closed the connection before its whole body came; nobody reads the answer, the
        # access log and the metrics count it as the client's doing (it was a 500 with two tracebacks).
        logger.info("the client left before its whole request body came")
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return APIError(500, "Internal server error", code="internal_error",
                        error_type="server_error").response(request.url.path)
