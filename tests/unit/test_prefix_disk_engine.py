"""The persistent prefix cache wired into the engine thread (engine/thread/worker.py + engine/prefix_cache/disk.py), with the
scripted fake runner of test_engine.py extended by the state API: what one engine saves, a restarted engine finds,
loads into its KV model (checked cell by cell) and serves as `cached_tokens`. No model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from edge_llm.engine.prefix_cache.disk import DiskPrefixCache
from edge_llm.engine.prefix_cache.store import PrefixStore
from edge_llm.engine.types import Finished, FinishReason, GenerationRequest
from edge_llm.engine.thread.worker import Engine

from .scheduler_model import _Cell
from .test_engine import EOG, TIMEOUT, FakeRunner, collect, last, request, submit

PROMPT = list(range(100, 420))  # 320 tokens


class StateRunner(FakeRunner):
    """KV state as JSON of the sequence's tokens by position; a load puts those cells into the KV model."""

    def save_sequence_state(self, seq_id: int) -> bytes:
        return json.dumps(self.kv.seqs[seq_id]).encode()

    def load_sequence_state(self, seq_id: int, data: bytes) -> bool:
        assert not self.kv.cells.get(seq_id), "a load into a sequence that holds cells"
        self.kv.cells[seq_id] = {p: _Cell(t) for p, t in enumerate(json.loads(data))}
        return True


async def answer(engine: Engine, req: GenerationRequest) -> list:
    return await collect(submit(engine, req))


def run_one(directory: Path, prompt: list[int]) -> tuple[Finished, Engine, StateRunner]:
    runner = StateRunner({1: [7, 8, EOG]})
    disk = DiskPrefixCache(PrefixStore(directory, "f" * 64, budget_bytes=1 << 20), min_new_tokens=64)
    engine = Engine(lambda: runner, n_ctx=1024, batch_size=64, parallel=2, cache_slots=2, queue_capacity=8,
                    disk_cache=disk)
    engine.start()
    assert engine.wait_loaded(TIMEOUT)
    try:
        events = asyncio.run(answer(engine, request("r", 1, prompt=prompt, max_tokens=8)))
    finally:
        engine.stop(timeout=TIMEOUT)
    finished = last(events)
    assert isinstance(finished, Finished) and finished.reason is FinishReason.STOP
    return finished, engine, runner


def test_a_restarted_engine_serves_the_saved_prefix(tmp_path: Path) -> None:
    first, engine, _ = run_one(tmp_path, PROMPT)
    assert first.usage.cached_tokens == 0
    stats = engine.stats().disk_cache
    assert stats is not None and stats["saved"] == 1 and stats["entries"] == 1  # written before the engine ended

    again, engine, runner = run_one(tmp_path, PROMPT[:300] + [5, 6, 7])
    assert again.usage.cached_tokens == 300
    stats = engine.stats().disk_cache
    assert stats is not None and stats["loaded"] == 1
    # the loaded entry holds the saved tokens (prompt and answer) at their positions
    assert any(tokens == PROMPT + [7, 8] for tokens in runner.kv.seqs.values())


def test_cache_prompt_false_neither_saves_nor_loads(tmp_path: Path) -> None:
    run_one(tmp_path, PROMPT)
    runner = StateRunner({1: [7, EOG]})
    disk = DiskPrefixCache(PrefixStore(tmp_path, "f" * 64, budget_bytes=1 << 20), min_new_tokens=64)
    engine = Engine(lambda: runner, n_ctx=1024, batch_size=64, parallel=2, cache_slots=2, queue_capacity=8,
                    disk_cache=disk)
    engine.start()
    assert engine.wait_loaded(TIMEOUT)
    try:
        req = request("r", 1, prompt=PROMPT + [1], max_tokens=8)
        req.cache_prompt = False
        finished = last(asyncio.run(answer(engine, req)))
    finally:
        engine.stop(timeout=TIMEOUT)
    assert isinstance(finished, Finished) and finished.usage.cached_tokens == 0
    assert engine.stats().disk_cache["loaded"] == 0 and engine.stats().disk_cache["saved"] == 0
