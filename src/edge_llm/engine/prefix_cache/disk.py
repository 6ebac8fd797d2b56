"""The persistent prefix cache on the engine thread (`--prefix-cache-dir`): what is saved, when an entry is loaded,
and the writer thread that puts saves on disk (the files and their index: engine/prefix_cache/store.py).

- Save: a sequence that finishes (stop or length, not cancelled or failed) is saved when it holds at least
  `min_new_tokens` tokens that no saved entry (nor a save still pending) already starts with. Its cells stay in
  the in-memory prefix cache as an entry; the KV state of that entry is copied on the engine thread (the context
  is not thread-safe) only when the engine is idle — no sequence running or waiting and no command queued — one
  entry per idle turn, so a copy never delays a step (a request arriving during one waits at most that copy), and
  at a graceful stop. The writer thread puts it on disk, so the engine never waits for the disk either. An entry
  evicted before the engine was idle is not saved.
- Load: a request whose prompt shares at least KEY_TOKENS tokens with a saved entry, `MIN_GAIN` more than the
  in-memory prefix cache or a running sequence would give it, gets the entry loaded into a free sequence id before
  the step that admits it: the cells are charged to the scheduler's ledger like any cache entry (evicting
  least-recently-used entries first), then the entry is an ordinary in-memory cache entry the request copies its
  prefix from. The file is read and checked on the engine thread, once per entry and restart.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Protocol

from edge_llm.engine.prefix_cache.store import PrefixStore, StoredEntry
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence
from edge_llm.engine.scheduling.step_plan import KvOp
from edge_llm.engine.scheduling.token_match import common_prefix_length
from edge_llm.engine.types import FinishReason

logger = logging.getLogger(__name__)

MIN_GAIN = 64  # tokens a load must save over what memory gives, to be worth reading a file
MAX_QUEUED_SAVES = 4  # states copied and not yet written (each is its tokens' KV: ~10 MiB for 900 f16 tokens)


class StateRunner(Protocol):
    def save_sequence_state(self, seq_id: int) -> bytes: ...
    def load_sequence_state(self, seq_id: int, data: bytes) -> bool: ...
    def apply_kv_ops(self, ops: list[KvOp]) -> None: ...


class DiskPrefixCache:
    def __init__(self, store: PrefixStore, *, min_new_tokens: int) -> None:
        self.store = store
        self.min_new_tokens = min_new_tokens
        self._candidates: dict[str, tuple[StoredEntry, int]] = {}  # request id → its best saved entry (engine thread)
        self._pending: list[tuple[int, ...]] = []  # worth saving, not yet copied (engine thread)
        self._queued: list[tuple[int, ...]] = []  # tokens of saves copied and not yet written (guarded by _lock)
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[tuple[int, ...], bytes] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="edge-llm-prefix-writer", daemon=True)
        self.last_copy_ms = 0.0  # the last save's state copy on the engine thread (while it was idle)
        self.last_load_ms = 0.0  # the last load: read, check and put into the KV

    # ---- lifecycle (engine thread) -----------------------------------------------------------

    def start(self) -> bool:
        """Reads the index and starts the writer; on the engine thread, once the model is loaded. False (logged)
        when the directory cannot be read: the server then runs without the persistent cache."""
        try:
            self.store.scan()
        except OSError as exc:  # the directory was checked at start-up; it may have gone since
            logger.error("the persistent prefix cache is off: %s", exc)
            return False
        self._writer.start()
        return True

    def close(self, scheduler: Scheduler | None = None, runner: StateRunner | None = None,
              timeout: float = 30.0) -> None:
        """Copies the pending saves when given the (idle) scheduler and runner, then lets the writer finish the
        saves queued: a graceful stop keeps them."""
        while runner is not None and scheduler is not None and self._pending:
            self.save_one_pending(scheduler, runner)
        if self._writer.is_alive():
            self._jobs.put(None)
            self._writer.join(timeout)

    # ---- requests (engine thread) ----------------------------------------------------------------

    def on_submitted(self, sequence: Sequence) -> None:
        if not sequence.use_cache:
            return
        match = self.store.best_match(sequence.prompt)
        if match is not None:
            entry, length = match
            self._candidates[sequence.request_id] = (entry, min(length, len(sequence.prompt) - 1))

    def before_step(self, scheduler: Scheduler, runner: StateRunner) -> None:
        """Loads the saved entries the sequences about to be admitted want, in the order admission takes them
        (the first that cannot get room stops the rest)."""
        if not self._candidates:
            return
        room = scheduler.parallel - len(scheduler.running)
        for sequence in scheduler.in_turn(max(room, 0)):
            candidate = self._candidates.get(sequence.request_id)
            if candidate is None:
                continue
            entry, length = candidate
            if sequence.preemptions or length - scheduler.reusable_length(sequence) < MIN_GAIN:
                del self._candidates[sequence.request_id]
                continue
            seq_id = scheduler.reserve_entry(sequence, len(entry.tokens), length)
            if seq_id is None:
                return  # it waits for running sequences to finish, as its admission will
            del self._candidates[sequence.request_id]
            runner.apply_kv_ops(scheduler.flush_ops())  # a removal queued for this id must not follow the load
            started = time.monotonic()
            try:
                state = self.store.load(entry)
                loaded = state is not None and runner.load_sequence_state(seq_id, state)
            except Exception:  # noqa: BLE001 - a failed load costs that request its prefix, never the engine
                logger.exception("loading a saved prefix failed")
                state, loaded = None, False
            if loaded:
                scheduler.adopt_entry(seq_id, entry.tokens)
                self.last_load_ms = (time.monotonic() - started) * 1000
                logger.info("loaded a saved prefix of %d tokens (%d shared) in %.1f ms", len(entry.tokens), length,
                            self.last_load_ms, extra={"request_id": sequence.request_id})
            else:
                scheduler.release_entry(seq_id)
                if state is not None:
                    self.store.counts["rejected"] += 1

    def forget(self, request_id: str) -> None:
        self._candidates.pop(request_id, None)

    def on_finished(self, sequence: Sequence, reason: FinishReason) -> None:
        """Marks a finished sequence's tokens for saving when it is worth it (see the module's rule); call it before
        the sequence leaves the scheduler for its cache entry. The copy waits for `save_one_pending`."""
        self._candidates.pop(sequence.request_id, None)
        if reason not in (FinishReason.STOP, FinishReason.LENGTH) or not sequence.use_cache or sequence.phase is not Phase.DECODE or sequence.moved is not None:
            return
        tokens = tuple(sequence.kv_tokens)
        if len(tokens) < self.min_new_tokens or len(tokens) != sequence.n_past:
            return
        match = self.store.best_match(tokens)
        known = match[1] if match else 0
        with self._lock:
            if len(self._queued) + len(self._pending) >= MAX_QUEUED_SAVES:
                logger.debug("not saving a prefix: %d saves are still pending", len(self._queued) + len(self._pending))
                return
            known = max([known] + [common_prefix_length(other, tokens) for other in self._queued + self._pending])
            if len(tokens) - known < self.min_new_tokens:
                return
            self._pending.append(tokens)

    @property
    def has_pending_saves(self) -> bool:
        return bool(self._pending)

    def save_one_pending(self, scheduler: Scheduler, runner: StateRunner) -> None:
        """Copies the oldest pending save's state out of the cache entry that holds its tokens and queues it for the
        writer; call it only while the engine is idle (between steps, nothing running or waiting)."""
        tokens = self._pending.pop(0)
        entry = next((e for e in scheduler.cache.values() if e.tokens[:len(tokens)] == tokens), None)
        if entry is None:
            self.store.counts["evicted_before_save"] += 1
            logger.debug("not saving a prefix of %d tokens: its cache entry was evicted first", len(tokens))
            return
        runner.apply_kv_ops(scheduler.flush_ops())  # an evicted entry's cells must be gone before the copy
        started = time.monotonic()
        state = runner.save_sequence_state(entry.seq_id)
        self.last_copy_ms = (time.monotonic() - started) * 1000
        logger.info("saving a prefix of %d tokens (%.1f MiB); state copied in %.1f ms", len(entry.tokens),
                    len(state) / 2**20, self.last_copy_ms)
        with self._lock:
            self._queued.append(entry.tokens)
        self._jobs.put((entry.tokens, state))
        # Pending saves this entry holds too (an earlier, shorter answer in the same chat) are in this copy.
        self._pending = [other for other in self._pending if entry.tokens[:len(other)] != other]

    # ---- the writer thread ----------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            tokens, state = job
            try:
                self.store.write(tokens, state)
            except Exception:  # noqa: BLE001 - a failed save (disk full, permissions) loses that entry only
                logger.exception("saving a prefix of %d tokens failed", len(tokens))
            finally:
                with self._lock:
                    self._queued.remove(tokens)

    def stats(self) -> dict[str, Any]:
        """Read from any thread."""
        return {"entries": len(self.store), "bytes": self.store.used_bytes, "budget_bytes": self.store.budget_bytes,
                "pending_saves": len(self._pending), **self.store.counts}
