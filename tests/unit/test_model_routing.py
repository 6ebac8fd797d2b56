"""The HTTP side of many models, with fake runners: a request's `model` picks its engine, an unknown one is a 404
listing the others (in each protocol's envelope), /v1/models shows states, load and unload, keep_alive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from edge_llm.api.app import create_app
from edge_llm.config import Settings
from edge_llm.engine.facade import EngineClient
from edge_llm.engine.types import ModelInfo
from edge_llm.engine.thread.worker import Engine
from edge_llm.registry.registry import ModelRegistry, ModelState
from edge_llm.registry.specs import ModelSpec
from tests.unit.test_ops_engine import SlowRunner


class NamedRunner(SlowRunner):
    """Tokenizes any text to one token: its model's number (1 for "one", 2 for "two")."""

    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number
        self.info = ModelInfo(path=Path(f"/models/{number}.gguf"), description=f"model {number}", n_params=number,
                              size_bytes=100, n_ctx_train=1024, n_vocab=10, chat_template=None, bos_text="",
                              eos_text="", add_bos=False, bos_token=None, metadata={})

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [self.number]


NUMBERS = {"one": 1, "two": 2}


def make_engine(spec: ModelSpec) -> EngineClient:
    runner = NamedRunner(NUMBERS[spec.name])
    return EngineClient(Engine(lambda: runner, n_ctx=1024, batch_size=64, parallel=2, cache_slots=0,
                               queue_capacity=8))


def two_model_app(**options: Any) -> tuple[Any, ModelRegistry]:
    specs = [ModelSpec(name, Path(f"/models/{name}.gguf"), (f"{name}-alias",), 100) for name in NUMBERS]
    options.setdefault("keep_alive", 300.0)
    registry = ModelRegistry(specs, make_engine, default_model="one", **options)
    return create_app(Settings(), registry=registry, on_fatal=lambda: None), registry


def call(app: Any, requests: Callable[[httpx.AsyncClient], Any]) -> Any:
    async def run() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            async with app.router.lifespan_context(app):
                return await requests(client)

    return asyncio.run(asyncio.wait_for(run(), 30))


def test_the_request_model_picks_the_engine_and_the_first_request_loads_it() -> None:
    app, registry = two_model_app()

    async def requests(client: httpx.AsyncClient) -> list[Any]:
        before = (await client.get("/v1/models")).json()
        one = await client.post("/tokenize", json={"model": "one", "content": "x"})
        two = await client.post("/tokenize", json={"model": "two-alias", "content": "x"})
        default = await client.post("/tokenize", json={"content": "x"})
        after = (await client.get("/v1/models")).json()
        ready = await client.get("/readyz")
        return [before, one.json(), two.json(), default.json(), after, ready]

    before, one, two, default, after, ready = call(app, requests)
    assert [(m["id"], m["state"], m["aliases"]) for m in before["data"]] == [
        ("one", "unloaded", ["one-alias"]), ("two", "unloaded", ["two-alias"])]
    assert (one["tokens"], two["tokens"], default["tokens"]) == ([1], [2], [1])
    assert [m["state"] for m in after["data"]] == ["loaded", "loaded"]
    assert ready.status_code == 200 and ready.json()["models"] == {"one": "loaded", "two": "loaded"}


def test_an_unknown_model_is_a_404_listing_the_available_ones_in_each_envelope() -> None:
    app, _ = two_model_app()

    async def requests(client: httpx.AsyncClient) -> list[httpx.Response]:
        return [await client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": []}),
                await client.post("/v1/messages", json={"model": "claude", "max_tokens": 8, "messages": []}),
                await client.get("/v1/models/nope")]

    openai, anthropic, card = call(app, requests)
    assert openai.status_code == 404 and openai.json()["error"]["code"] == "model_not_found"
    assert "available: one, two, one-alias, two-alias" in openai.json()["error"]["message"]
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "not_found_error" and "one, two" in anthropic.json()["error"]["message"]
    assert card.status_code == 404


def test_load_unload_and_keep_alive_zero() -> None:
    app, registry = two_model_app()

    async def requests(client: httpx.AsyncClient) -> list[Any]:
        loaded = await client.post("/models/load", json={"model": "two", "keep_alive": -1})
        pinned = registry.resolve("two").pinned
        unloaded = await client.post("/models/unload", json={"model": "two"})
        once = await client.post("/tokenize", json={"model": "one", "content": "x", "keep_alive": 0})
        entry = registry.resolve("one")
        while entry.state is not ModelState.UNLOADED:
            await registry.wait_for_change(1.0)
        bad = await client.post("/tokenize", json={"model": "one", "content": "x", "keep_alive": "soon"})
        missing = await client.post("/models/load", json={"model": "three"})
        return [loaded.json(), pinned, unloaded.json(), once.status_code, bad, missing]

    loaded, pinned, unloaded, once, bad, missing = call(app, requests)
    assert loaded["state"] == "loaded" and pinned and loaded["keep_alive"] == "never unloaded"
    assert unloaded == {"model": "two", "state": "unloaded"}
    assert once == 200
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"
    assert missing.status_code == 404 and "available: one, two" in missing.json()["error"]["message"]


def test_no_room_is_a_503_with_retry_after_naming_the_model_that_holds_it() -> None:
    app, registry = two_model_app(max_loaded=1, wait_timeout=0.05)

    async def requests(client: httpx.AsyncClient) -> httpx.Response:
        lease = await registry.acquire("one")  # a request in flight on "one"
        try:
            return await client.post("/tokenize", json={"model": "two", "content": "x"})
        finally:
            lease.release()

    refused = call(app, requests)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    error = refused.json()["error"]
    assert error["code"] == "model_memory_busy" and "one (~" in error["message"] and "in flight" in error["message"]
