"""The persistent prefix cache's files and index (engine/prefix_cache/store.py) and its engine-side rules
(engine/prefix_cache/disk.py) with a fake runner: no model."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edge_llm.engine.prefix_cache.disk import DiskPrefixCache
from edge_llm.engine.prefix_cache.store import KEY_TOKENS, PrefixStore, entry_name, kv_fingerprint, read_header
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.step_plan import KvOp
from edge_llm.engine.types import FinishReason

FP = "a" * 64
STATE = bytes(range(256)) * 40  # 10 KiB of opaque "KV state"


def prompt(n: int, start: int = 1000) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def store(directory: Path, budget: int = 1 << 20, fingerprint: str = FP) -> PrefixStore:
    result = PrefixStore(directory, fingerprint, budget_bytes=budget)
    result.scan()
    return result


def test_an_entry_survives_a_restart_and_is_found_by_its_prefix(tmp_path: Path) -> None:
    tokens = prompt(300)
    assert store(tmp_path).write(tokens, STATE)
    again = store(tmp_path)
    assert len(again) == 1
    match = again.best_match(tokens[:200] + (7, 8, 9))
    assert match is not None and match[1] == 200
    assert again.load(match[0]) == STATE
    assert again.best_match(prompt(300, start=5)) is None  # another prefix
    assert again.best_match(tokens[:KEY_TOKENS - 1]) is None  # too short to be worth a load


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_entries_are_never_loaded(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    tokens = prompt(300)
    store(tmp_path).write(tokens, STATE)
    path = tmp_path / entry_name(tokens)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[:-100])
    elif damage == "flip":
        path.write_bytes(data[:-50] + bytes([data[-50] ^ 0xFF]) + data[-49:])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    else:
        path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="edge_llm.engine.prefix_cache.store"):
        again = store(tmp_path)
        match = again.best_match(tokens)
        if match is not None:  # a flipped state byte passes the header check: the checksum catches it on load
            assert again.load(match[0]) is None
    assert "ignored and deleted" in caplog.text
    assert again.best_match(tokens) is None
    assert again.counts["rejected"] == 1
    assert not path.exists()


def test_a_file_damaged_after_the_start_is_refused_on_load(tmp_path: Path) -> None:
    tokens = prompt(300)
    running = store(tmp_path)
    running.write(tokens, STATE)
    match = running.best_match(tokens)
    assert match is not None
    path = tmp_path / entry_name(tokens)
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    assert running.load(match[0]) is None
    assert running.best_match(tokens) is None


def test_foreign_entries_are_ignored_and_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tokens = prompt(300)
    store(tmp_path, fingerprint="b" * 64).write(tokens, STATE)
    with caplog.at_level(logging.WARNING, logger="edge_llm.engine.prefix_cache.store"):
        ours = store(tmp_path)
    assert ours.best_match(tokens) is None and len(ours) == 0
    assert "another model file or KV settings" in caplog.text
    assert (tmp_path / entry_name(tokens)).exists()  # another server's entry


def test_a_save_cut_short_leaves_no_entry(tmp_path: Path) -> None:
    tokens = prompt(300)
    store(tmp_path).write(tokens, STATE)
    (tmp_path / (entry_name(prompt(400, 7)) + ".tmp")).write_bytes(b"EDGEKV\x00\x01half a file")
    again = store(tmp_path)
    assert len(again) == 1 and again.best_match(tokens) is not None
    assert not list(tmp_path.glob("*.tmp"))


def test_the_budget_evicts_the_least_recently_used(tmp_path: Path) -> None:
    entry_bytes = len(STATE) + 4 * 300 + 300  # about: state, tokens and header
    cache = store(tmp_path, budget=3 * entry_bytes)
    first, second, third, fourth = (prompt(300, start) for start in (0, 10_000, 20_000, 30_000))
    for tokens in (first, second, third):
        assert cache.write(tokens, STATE)
    match = cache.best_match(first)
    assert match is not None and cache.load(match[0]) is not None  # `first` used: `second` is now the oldest
    cache.write(fourth, STATE)
    assert cache.best_match(second) is None
    assert all(cache.best_match(t) is not None for t in (first, third, fourth))
    assert cache.used_bytes <= 3 * entry_bytes
    assert cache.counts["evicted"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(entry_name(t) for t in (first, third, fourth))
    # the order survives a restart (a use touches the file), and a lower budget evicts at start-up
    smaller = store(tmp_path, budget=2 * entry_bytes)
    assert smaller.best_match(third) is None and smaller.best_match(first) is not None


def test_an_entry_larger_than_the_budget_is_not_saved(tmp_path: Path) -> None:
    cache = store(tmp_path, budget=1000)
    assert not cache.write(prompt(300), STATE)
    assert not list(tmp_path.iterdir())


def test_a_longer_entry_replaces_the_one_it_covers(tmp_path: Path) -> None:
    cache = store(tmp_path)
    cache.write(prompt(300), STATE)
    cache.write(prompt(500), STATE)
    assert len(cache) == 1
    assert read_header(tmp_path / entry_name(prompt(500))).tokens == prompt(500)


def test_the_fingerprint_follows_the_model_and_the_kv_settings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(4000))
    base = kv_fingerprint(model, cache_type_k="f16", cache_type_v="f16", flash_attn="auto")
    assert base == kv_fingerprint(model, cache_type_k="f16", cache_type_v="f16", flash_attn="auto")
    assert base != kv_fingerprint(model, cache_type_k="q8_0", cache_type_v="f16", flash_attn="auto")
    assert base != kv_fingerprint(model, cache_type_k="f16", cache_type_v="f16", flash_attn="off")
    model.write_bytes(b"GGUF" + bytes(3999) + b"\x01")
    assert base != kv_fingerprint(model, cache_type_k="f16", cache_type_v="f16", flash_attn="auto")


# ---- the engine side, with a fake runner ----------------------------------------------------------------------


class FakeRunner:
    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.loaded: dict[int, bytes] = {}
        self.ops: list[KvOp] = []
        self.saved: list[int] = []

    def save_sequence_state(self, seq_id: int) -> bytes:
        self.saved.append(seq_id)
        return STATE

    def load_sequence_state(self, seq_id: int, data: bytes) -> bool:
        if self.accept:
            self.loaded[seq_id] = data
        return self.accept

    def apply_kv_ops(self, ops: list[KvOp]) -> None:
        self.ops += ops


def finish_one(scheduler: Scheduler, disk: DiskPrefixCache, runner: FakeRunner, tokens: list[int], *,
               idle: bool = True) -> None:
    sequence = scheduler.add(f"r{len(scheduler.cache)}-{tokens[0]}", tokens, 4)
    disk.on_submitted(sequence)
    while sequence.phase.value != "decode" or sequence.pending_token is not None:
        scheduler.step()
        if sequence.phase.value == "decode":
            scheduler.on_sampled(sequence, 5)
            break
    disk.on_finished(sequence, FinishReason.STOP)
    scheduler.remove(sequence, keep_in_cache=True)
    while idle and disk.has_pending_saves:  # the engine is idle now
        disk.save_one_pending(scheduler, runner)


def test_a_finished_sequence_is_saved_and_a_restarted_engine_loads_it_through_the_ledger(tmp_path: Path) -> None:
    runner = FakeRunner()
    disk = DiskPrefixCache(store(tmp_path), min_new_tokens=64)
    disk.start()
    scheduler = Scheduler(n_ctx=2048, batch_size=512, parallel=2, cache_slots=2)
    finish_one(scheduler, disk, runner, list(prompt(300)))
    disk.close()
    assert disk.store.counts["saved"] == 1

    restarted = DiskPrefixCache(store(tmp_path), min_new_tokens=64)
    restarted.start()
    fresh = Scheduler(n_ctx=2048, batch_size=512, parallel=2, cache_slots=2)
    sequence = fresh.add("again", list(prompt(300)[:250]) + [1, 2, 3], 4)
    restarted.on_submitted(sequence)
    restarted.before_step(fresh, runner)
    assert len(fresh.cache) == 1 and fresh.kv_cells_used == 300  # the loaded entry's cells are in the ledger
    (seq_id,) = runner.loaded
    fresh.step()
    assert sequence.cached_tokens == 250  # taken from the loaded entry, as from any cache entry
    assert restarted.store.counts["loaded"] == 1
    restarted.close()


def test_short_or_known_sequences_are_not_saved_and_a_refused_state_frees_its_id(tmp_path: Path) -> None:
    runner = FakeRunner()
    disk = DiskPrefixCache(store(tmp_path), min_new_tokens=200)
    disk.start()
    scheduler = Scheduler(n_ctx=4096, batch_size=512, parallel=2, cache_slots=2)
    finish_one(scheduler, disk, runner, list(prompt(150)))  # too short
    finish_one(scheduler, disk, runner, list(prompt(300)))
    finish_one(scheduler, disk, runner, list(prompt(300)) + list(range(50)))  # 50 new tokens: not worth it
    disk.close()
    assert disk.store.counts["saved"] == 1 and len(disk.store) == 1

    refusing = FakeRunner(accept=False)
    restarted = DiskPrefixCache(store(tmp_path), min_new_tokens=200)
    restarted.start()
    fresh = Scheduler(n_ctx=4096, batch_size=512, parallel=2, cache_slots=2)
    sequence = fresh.add("again", list(prompt(300)) + [1], 4)
    restarted.on_submitted(sequence)
    restarted.before_step(fresh, refusing)
    assert not fresh.cache and fresh.kv_cells_used == 0
    fresh.step()
    assert sequence.cached_tokens == 0
    restarted.close()


def test_a_save_copies_its_cache_entry_when_idle_and_is_dropped_if_the_entry_left_memory_first(
        tmp_path: Path) -> None:
    runner = FakeRunner()
    disk = DiskPrefixCache(store(tmp_path), min_new_tokens=64)
    disk.start()
    scheduler = Scheduler(n_ctx=4096, batch_size=512, parallel=2, cache_slots=1)
    finish_one(scheduler, disk, runner, list(prompt(300)), idle=False)
    assert disk.has_pending_saves and not runner.saved  # nothing is copied while the engine may be busy
    (entry,) = scheduler.cache.values()
    disk.save_one_pending(scheduler, runner)
    assert runner.saved == [entry.seq_id] and not disk.has_pending_saves

    finish_one(scheduler, disk, runner, list(range(7, 307)), idle=False)
    finish_one(scheduler, disk, runner, list(range(9, 309)), idle=False)
    assert disk.stats()["pending_saves"] == 2  # range(7, 307)'s entry was evicted by the next (one cache slot)
    while disk.has_pending_saves:
        disk.save_one_pending(scheduler, runner)
    assert disk.store.counts["evicted_before_save"] == 1
    disk.close()
    assert disk.store.counts["saved"] == 2


def test_one_copy_serves_every_pending_save_its_entry_holds(tmp_path: Path) -> None:
    """A chat's second answer extends its first: the first's entry is covered by the second's, so one copy of that
    entry saves both."""
    runner = FakeRunner()
    disk = DiskPrefixCache(store(tmp_path), min_new_tokens=64)
    disk.start()
    scheduler = Scheduler(n_ctx=4096, batch_size=512, parallel=2, cache_slots=2)
    finish_one(scheduler, disk, runner, list(prompt(300)), idle=False)
    (first,) = scheduler.cache.values()
    finish_one(scheduler, disk, runner, list(first.tokens) + list(range(1000, 1100)), idle=False)
    assert disk.stats()["pending_saves"] == 2 and len(scheduler.cache) == 1  # the first entry was covered
    while disk.has_pending_saves:
        disk.save_one_pending(scheduler, runner)
    assert len(runner.saved) == 1
    disk.close()
    assert disk.store.counts["saved"] == 1


def test_no_load_without_room_for_it(tmp_path: Path) -> None:
    runner = FakeRunner()
    disk = DiskPrefixCache(store(tmp_path), min_new_tokens=64)
    disk.store.write(prompt(300), STATE)
    disk.start()
    scheduler = Scheduler(n_ctx=512, batch_size=512, parallel=2, cache_slots=2)
    busy = scheduler.add("busy", list(range(5, 405)), 16)
    scheduler.step()  # 400 cells of 512 held by a running sequence
    sequence = scheduler.add("again", list(prompt(300)) + [1], 4)
    disk.on_submitted(sequence)
    disk.before_step(scheduler, runner)
    assert not runner.loaded and not scheduler.cache
    assert busy.n_past > 0
    disk.close()
