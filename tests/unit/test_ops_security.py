"""API keys, the Host and Origin checks, and the exposure warning, without a server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from edge_llm.api.security import ApiKeyAuth, HostGuard, is_loopback, load_api_keys, warn_if_exposed
from edge_llm.config import Settings


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    pass


def guard(bind: str = "127.0.0.1", hosts: list[str] | None = None, origins: list[str] | None = None) -> HostGuard:
    return HostGuard(_app, bind_host=bind, allowed_hosts=hosts or [], cors_origins=origins or [])


@pytest.mark.parametrize("host", ["localhost", "localhost:3000", "127.0.0.1", "127.0.0.1:3000", "[::1]:3000",
                                  "[::1]", "LOCALHOST:1", "localhost.:3000"])
def test_loopback_names_are_always_allowed(host: str) -> None:
    assert guard().host_allowed(host)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:3000", "127.0.0.1.evil.example", "",
                                  "localhost@evil.example", "[::2]:3000", "10.0.0.1"])
def test_other_hosts_are_refused(host: str) -> None:
    assert not guard().host_allowed(host)


def test_allowed_hosts_and_the_bound_address() -> None:
    assert guard("10.1.2.3").host_allowed("10.1.2.3:8080")
    custom = guard(hosts=["api.example", "Other.Example:9000"])
    assert custom.host_allowed("api.example:3000") and custom.host_allowed("other.example")
    assert not custom.host_allowed("evil.example")
    assert guard(hosts=["*"]).host_allowed("anything.example")


def test_origins() -> None:
    plain = guard()
    assert plain.origin_allowed("http://127.0.0.1:3000", "127.0.0.1:3000")  # same origin
    assert not plain.origin_allowed("http://127.0.0.1:3001", "127.0.0.1:3000")
    assert not plain.origin_allowed("http://evil.example", "127.0.0.1:3000")
    assert not plain.origin_allowed("null", "127.0.0.1:3000")
    listed = guard(origins=["http://app.example/"])
    assert listed.origin_allowed("http://app.example", "127.0.0.1:3000")
    assert not listed.origin_allowed("https://app.example", "127.0.0.1:3000")
    assert guard(origins=["*"]).origin_allowed("http://any.example", None)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def refusal(keys: list[str], authorization: str | None = None, api_key: str | None = None) -> str | None:
    """Why ApiKeyAuth refuses a request with these headers (a 401), as its warning line says; None when it lets the
    request through to the app."""
    headers = [(name.encode(), value.encode("latin-1")) for name, value in (("authorization", authorization),
                                                                  ("x-api-key", api_key)) if value is not None]
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 50000), "state": {}}
    reached: list[bool] = []
    sent: list[dict] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        reached.append(True)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    records = _Records()
    security_log = logging.getLogger("edge_llm.api.security")
    security_log.addHandler(records)
    try:
        asyncio.run(ApiKeyAuth(app, keys)(scope, receive, send))
    finally:
        security_log.removeHandler(records)
    if reached:
        assert not sent and not records.messages
        return None
    assert sent[0]["status"] == 401
    (line,) = [m for m in records.messages if m.startswith("authentication failed: ")]
    return line.removeprefix("authentication failed: ")


def test_key_check() -> None:
    keys = ["k1", "k2"]
    assert refusal(keys, "Bearer k1") is None and refusal(keys, "bearer  k2 ") is None
    assert refusal(keys) == "missing key"
    assert refusal(keys, "Bearer k3") == "wrong key"
    assert refusal(keys, "Bearer k1x") == "wrong key"
    assert refusal(keys, "Basic k1") == "malformed Authorization header"
    assert refusal(keys, "Bearer") == "malformed Authorization header"


def test_load_api_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# comment\n\n  file-key  \nflag-key\n")
    settings = Settings(api_key=["flag-key"], api_key_file=keys)
    assert load_api_keys(settings) == ["flag-key", "file-key"]
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no keys"):
        load_api_keys(Settings(api_key_file=empty))
    with pytest.raises(ValueError, match="cannot read"):
        load_api_keys(Settings(api_key_file=tmp_path / "missing"))
    assert load_api_keys(Settings()) == []


def test_exposure_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    with caplog.at_level(logging.WARNING):
        warn_if_exposed(Settings(host="127.0.0.1"), [])
        warn_if_exposed(Settings(host="0.0.0.0"), ["k"])
        assert not caplog.records
        warn_if_exposed(Settings(host="0.0.0.0"), [])
    assert "without an API key" in caplog.records[0].getMessage()
