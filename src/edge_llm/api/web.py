"""The web chat: `GET /` and its two static files, shipped in the package (edge_llm/web/).

`/` also answers the "is Ollama running" probes of Ollama's clients: a browser (Accept: text/html) gets the chat;
anything else gets Ollama's own `Ollama is running` (text/plain), and `HEAD /` is a 200.

The page holds no secret, so it needs no API key (security.ApiKeyAuth lets `WEB_PATHS` through);
it calls the public /v1/chat/completions API with the key the user typed, if any. It loads nothing
from anywhere else, and its Content-Security-Policy says so.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.exceptions import HTTPException

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
_PAGE = ("index.html", "text/html; charset=utf-8")
_ASSETS = {
    "chat.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
}
WEB_PATHS = frozenset({"/", *(f"/web/{name}" for name in _ASSETS)})

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

web_router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=None)
def _read(name: str) -> bytes:
    return (WEB_DIR / name).read_bytes()


def _file(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=_HEADERS)


OLLAMA_PROBE_ANSWER = "Ollama is running"


@web_router.api_route("/", methods=["GET", "HEAD"])
async def index(request: Request) -> Response:
    if "text/html" in request.headers.get("accept", ""):
        return _file(*_PAGE)
    return PlainTextResponse(OLLAMA_PROBE_ANSWER)


@web_router.get("/web/{name}")
async def asset(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise HTTPException(404)
    return _file(name, media_type)
