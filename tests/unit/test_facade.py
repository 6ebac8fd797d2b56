"""The engine facade (engine/facade.py) over a fake engine, and the rule that the API layer uses nothing else."""

from __future__ import annotations

import ast
import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import edge_llm.api
from edge_llm.engine.facade import BULK_NICENESS, EngineClient
from edge_llm.engine.types import (
    EngineStats,
    EngineUnavailableError,
    GenerationRequest,
    QueueFullError,
)
from edge_llm.engine.thread.watchdog import Watchdog


class FakeVocabulary:
    n_vocab = 10

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [ord(c) % 10 for c in text]

    def is_valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab


class FakeEngine:
    """The parts of `worker.Engine` the facade uses, set by hand."""

    def __init__(self, *, capacity: int = 8) -> None:
        self.runner: Any = FakeVocabulary()
        self.alive = True
        self.ready = True
        self.failure: BaseException | None = None
        self.queue_capacity = capacity
        self.watchdog = Watchdog("engine", None)
        self.waiting = 0
        self.submitted: list[tuple[str, Any]] = []
        self.aborted: list[str] = []
        self.hooks: list[Callable[[], None]] = []
        self.events: list[str] = []

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        self.hooks.append(hook)

    def submit(self, request: GenerationRequest, sender: Any) -> None:
        if len(self.submitted) >= self.queue_capacity:
            raise QueueFullError("full")
        self.submitted.append((request.request_id, sender))

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(waiting=self.waiting, running=0, cached_sequences=0, kv_cells_used=0,
                           kv_cells_total=64)

    def stop(self, timeout: float | None = None) -> bool:
        self.events.append("engine stopped")
        self.ready = self.alive = False
        return True


def _requests(count: int) -> list[GenerationRequest]:
    return [GenerationRequest(request_id=f"r/{i}", prompt_tokens=[1], max_tokens=4) for i in range(count)]


def test_submit_gives_each_choice_its_sender_on_one_channel() -> None:
    engine = FakeEngine()
    client = EngineClient(engine)  # type: ignore[arg-type]

    async def run() -> None:
        channel = client.submit(_requests(3))
        assert channel.choices == 3
        assert [sender.route() for _, sender in engine.submitted] == [(channel, 0), (channel, 1), (channel, 2)]

    asyncio.run(run())


def test_submit_is_all_or_none() -> None:
    engine = FakeEngine(capacity=2)
    client = EngineClient(engine)  # type: ignore[arg-type]

    async def run() -> None:
        with pytest.raises(QueueFullError):
            client.submit(_requests(3))

    asyncio.run(run())
    assert engine.aborted == ["r/0", "r/1"]  # those already submitted are taken back


def test_readiness_says_why() -> None:
    engine = FakeEngine(capacity=2)
    client = EngineClient(engine)  # type: ignore[arg-type]
    assert client.readiness() == (True, "ready")
    engine.waiting = 2
    assert client.readiness() == (False, "queue_full")
    engine.ready = False
    assert client.readiness() == (False, "stopped")
    engine.alive = False
    assert client.readiness() == (False, "engine_dead")
    engine.runner = None
    assert client.readiness() == (False, "engine_dead") and not client.loaded
    engine.alive = True
    assert client.readiness() == (False, "loading")


def test_vocabulary_work_needs_a_ready_model() -> None:
    engine = FakeEngine()
    client = EngineClient(engine)  # type: ignore[arg-type]
    assert client.tokenize("ab", add_special=False, parse_special=False) == [7, 8]
    assert client.is_valid_token(9) and not client.is_valid_token(10)
    engine.runner, engine.ready = None, False
    with pytest.raises(EngineUnavailableError, match="not loaded yet"):
        client.tokenize("ab", add_special=False, parse_special=False)
    assert client.model_info is None
    engine.alive = False
    with pytest.raises(EngineUnavailableError, match="not running"):
        client.is_valid_token(1)


def test_vocabulary_work_runs_in_the_tokenizer_thread_until_close() -> None:
    engine = FakeEngine()
    client = EngineClient(engine)  # type: ignore[arg-type]
    assert len(engine.hooks) == 1  # the engine closes the tokenizer thread before it frees the model

    async def run() -> None:
        thread = await client.in_tokenizer_thread(lambda: threading.current_thread().name)
        assert thread.startswith("edge-llm-tokenizer")
        (close_tokenizer,) = engine.hooks  # the engine runs it before it frees the model; here, it still runs
        close_tokenizer()
        with pytest.raises(EngineUnavailableError, match="not running"):
            await client.in_tokenizer_thread(lambda: None)

    asyncio.run(run())
    assert client.close() and engine.events == ["engine stopped"]
    client.close()  # idempotent


def test_a_large_requests_work_runs_in_its_own_thread_so_the_tokenizer_thread_stays_free() -> None:
    engine = FakeEngine()
    client = EngineClient(engine)  # type: ignore[arg-type]
    release = threading.Event()
    inside = threading.Event()

    def megabyte_prompt() -> str:
        inside.set()
        release.wait(5)
        return threading.current_thread().name

    async def run() -> None:
        bulk = asyncio.ensure_future(client.in_bulk_thread(megabyte_prompt))
        assert await asyncio.to_thread(inside.wait, 5)
        # the bulk thread is busy: an ordinary request's work still runs at once
        ordinary = await asyncio.wait_for(client.in_tokenizer_thread(lambda: threading.current_thread().name), 5)
        assert ordinary.startswith("edge-llm-tokenizer")
        release.set()
        assert (await bulk).startswith("edge-llm-bulk-tokenizer")
        # the bulk thread runs at a lower priority, the tokenizer thread at the process's
        process_nice = os.getpriority(os.PRIO_PROCESS, 0)
        niceness = await client.in_bulk_thread(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert niceness == min(19, process_nice + BULK_NICENESS)
        assert await client.in_tokenizer_thread(
            lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == process_nice

    asyncio.run(run())
    assert client.close()
    with pytest.raises(EngineUnavailableError, match="not running"):
        asyncio.run(client.in_bulk_thread(lambda: None))


def test_the_api_layer_uses_only_the_facade_and_plain_data() -> None:
    """api/ imports from the engine only `engine.facade` and `engine.types`."""
    allowed = {"edge_llm.engine.facade", "edge_llm.engine.types"}
    found: dict[str, set[str]] = {}
    for path in Path(edge_llm.api.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("edge_llm.engine") and name not in allowed:
                    found.setdefault(str(path), set()).add(name)
    assert found == {}
