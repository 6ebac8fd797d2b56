"""Exposure controls: API keys, the Host check (DNS-rebinding defence) and the Origin check.

/healthz and /readyz stay open to probes: they need no key and skip the Host check. The web chat's
page and files (api.web.WEB_PATHS) need no key either (they hold no secret) but pass the Host check.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import socket
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from edge_llm.api.errors import APIError
from edge_llm.api.middleware import OPEN_PATHS
from edge_llm.api.response_store import KEY_OWNER_STATE, key_owner
from edge_llm.api.web import WEB_PATHS
from edge_llm.config import Settings

logger = logging.getLogger(__name__)

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
LOCALHOST_ORIGINS = "localhost"  # the --cors-origins keyword (llama-server's): any port on this machine's loopback


def allows_localhost(cors_origins: list[str]) -> bool:
    return any(origin.strip().lower() == LOCALHOST_ORIGINS for origin in cors_origins)


def is_localhost_origin(origin: str) -> bool:
    """An http(s) origin whose host is localhost, 127.0.0.1 or [::1], at any port."""
    try:
        parts = urlsplit(origin.strip())
        return parts.scheme in ("http", "https") and parts.hostname in ("localhost", "127.0.0.1", "::1")
    except ValueError:
        return False


class LocalhostAwareCORS(CORSMiddleware):
    """Starlette's CORS, which also allows every localhost origin when --cors-origins holds the `localhost` keyword."""

    def __init__(self, app: ASGIApp, *, allow_localhost: bool, **options: object) -> None:
        super().__init__(app, **options)  # type: ignore[arg-type]
        self.allow_localhost = allow_localhost

    def is_allowed_origin(self, origin: str) -> bool:
        return super().is_allowed_origin(origin) or (self.allow_localhost and is_localhost_origin(origin))


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


# ---- API keys -----------------------------------------------------------------------------


def load_api_keys(settings: Settings) -> list[str]:
    """`--api-key` values plus the lines of `--api-key-file`. A key file without keys is an error,
    not a silently open server."""
    keys = list(settings.api_key)
    if settings.api_key_file is not None:
        path = settings.api_key_file.expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read the API key file {path}: {exc.strerror or exc}") from None
        from_file = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not from_file:
            raise ValueError(f"the API key file {path} holds no keys")
        keys.extend(from_file)
    return list(dict.fromkeys(keys))


class ApiKeyAuth:
    """Every route but the probes needs a key: `Authorization: Bearer <key>`, or `x-api-key: <key>` as Anthropic's
    clients send it. Each credential given must be a key (compared in constant time), so a wrong one is never
    outvoted by a right one."""

    def __init__(self, app: ASGIApp, keys: list[str]) -> None:
        self.app = app
        self._keys = [key.encode() for key in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"] in WEB_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        authorization, api_key = headers.get("authorization"), headers.get("x-api-key")
        problem = self._check(authorization, api_key)
        if problem is None:
            # Whose stored responses this request may see (api/response_store.py): the key it came in with.
            token = authorization.strip().partition(" ")[2] if authorization is not None else api_key
            scope.setdefault("state", {})[KEY_OWNER_STATE] = key_owner((token or "").strip())
            await self.app(scope, receive, send)
            return
        logger.warning("authentication failed: %s", problem, extra={"client": _client(scope), "path": scope["path"]})
        message = (
            "Incorrect API key provided" if problem == "wrong key"
            else "Missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
        )
        error = APIError(401, message, code="invalid_api_key", error_type="authentication_error",
                         headers={"www-authenticate": "Bearer"})
        await error.response(scope["path"])(scope, receive, send)

    def _check(self, authorization: str | None, api_key: str | None = None) -> str | None:
        if authorization is None and api_key is None:
            return "missing key"
        given: list[str] = []
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                return "malformed Authorization header"
            given.append(token)
        if api_key is not None:
            if not api_key.strip():
                return "empty x-api-key header"
            given.append(api_key.strip())
        return None if all(self._known(token) for token in given) else "wrong key"

    def _known(self, token: str) -> bool:
        given = token.encode("latin-1", "replace")
        matched = False
        for key in self._keys:  # no early exit: the time does not depend on which key matched
            matched |= hmac.compare_digest(given, key)
        return matched


# ---- Host and Origin -------------------------------------------------------------------------


_BRACKETED = re.compile(r"\[[^\]]*\](:[0-9]*)?")  # an IPv6 literal, with or without a port


def _hostname(authority: str) -> str | None:
    """The host part of a Host header or an origin's authority, lower-case, without port or brackets."""
    authority = authority.strip()
    # urlsplit reads "[::1].evil.example" as the host ::1 (it ignores what follows the bracket): refused.
    if authority.startswith("[") and not _BRACKETED.fullmatch(authority):
        return None
    try:
        name = urlsplit("//" + authority).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def own_host_names(bind_host: str) -> set[str]:
    """Loopback names, the bound address, and when reachable from elsewhere this machine's names
    (and, bound to every interface, its addresses). No DNS lookups for a loopback bind."""
    names = {"localhost", "127.0.0.1", "::1"}
    if bind_host.lower() not in _WILDCARD_HOSTS:
        names.add(bind_host.strip("[]").lower())
    if is_loopback(bind_host):
        return names
    try:
        hostname = socket.gethostname()
        names.update({hostname.lower(), socket.getfqdn().lower()})
        if bind_host in _WILDCARD_HOSTS:  # listening everywhere: this machine's addresses too
            names.update(str(info[4][0]).lower() for info in socket.getaddrinfo(hostname, None))
    except OSError:
        pass
    return names


class HostGuard:
    """Refuses (403) a Host header naming anything but this server, and a browser Origin that is neither
    this server itself (same origin) nor listed in `--cors-origins`."""

    def __init__(self, app: ASGIApp, *, bind_host: str, allowed_hosts: list[str], cors_origins: list[str]) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.host_names = own_host_names(bind_host) | {
            name for name in (_hostname(h) for h in allowed_hosts if h != "*") if name
        }
        self.any_origin = "*" in cors_origins
        self.origins = {origin.rstrip("/").lower() for origin in cors_origins}
        self.localhost_origins = allows_localhost(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not self.host_allowed(host):
            logger.warning("refused Host header %r", host[:200], extra={"client": _client(scope)})
            await self._refuse(scope, receive, send, f"The Host '{host[:200]}' is not served here (see --allowed-hosts)",
                               "host_not_allowed")
            return
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            logger.warning("refused Origin %r", origin[:200], extra={"client": _client(scope)})
            await self._refuse(scope, receive, send, f"The origin '{origin[:200]}' is not allowed (see --cors-origins)",
                               "origin_not_allowed")
            return
        await self.app(scope, receive, send)

    def host_allowed(self, host: str) -> bool:
        if self.any_host:
            return True
        name = _hostname(host)
        return name is not None and name in self.host_names

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or origin in self.origins or (self.localhost_origins and is_localhost_origin(origin)):
            return True
        # Same origin: a page served by this very server (scheme://<the Host it was asked by>).
        parts = urlsplit(origin)
        return bool(host) and parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, message: str, code: str) -> None:
        error = APIError(403, message, code=code, error_type="permission_error")
        await error.response(scope["path"])(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_exposed(settings: Settings, keys: list[str]) -> None:
    if not keys and not is_loopback(settings.host):
        logger.warning(
            "listening on %s without an API key: anyone who can reach this address can use the model. "
            "Set --api-key / --api-key-file (or EDGE_LLM_API_KEY), or bind to 127.0.0.1.",
            settings.host,
        )
