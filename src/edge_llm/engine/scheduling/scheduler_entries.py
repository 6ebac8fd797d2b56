"""The scheduler's side of cache entries that come from outside the step loop (the persistent prefix cache,
engine/prefix_cache/disk.py): a sequence id and cells reserved for an entry, the entry adopted into the cache and the
ledger, or the id given back. Pure bookkeeping, no llama.cpp; a mixin of `Scheduler` (engine/scheduling/scheduler.py), whose
admission rules it reuses, kept apart so that the scheduler's own module stays about admission and steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_llm.engine.scheduling.sequence import CacheEntry, Sequence
from edge_llm.engine.scheduling.step_plan import KvOp

if TYPE_CHECKING:
    from edge_llm.engine.scheduling.scheduler import Scheduler


class OutsideEntries:
    def reusable_length(self: Scheduler, sequence: Sequence) -> int:
        """How much of a waiting sequence's feed the cache or a running leader would give it now."""
        match = self._best_prefix(sequence.feed) if sequence.use_cache else None
        lead = self._best_running_prefix(sequence)
        return max(match[1] if match else 0, lead[1] if lead else 0)

    def flush_ops(self: Scheduler) -> list[KvOp]:
        """Every queued KV op, in the order the next step would hand them out; only between a step's decode and the
        next step (then the ops that wait for a decode may go)."""
        ops, self._after_decode_ops, self._pending_ops = self._after_decode_ops + self._pending_ops, [], []
        return ops

    def reserve_entry(self: Scheduler, head: Sequence, n_tokens: int, shared: int) -> int | None:
        """A free sequence id for a cache entry of `n_tokens` loaded from outside, which `head` will then take its
        first `shared` positions from, with the cells for both: least-recently-used entries are evicted as for an
        admission. None when only running sequences finishing could make room. The caller applies `flush_ops()`
        before it fills the id, then calls `adopt_entry` or `release_entry`."""
        if self.cache_slots == 0 or n_tokens <= 0 or n_tokens > self.sequence_context:
            return None  # (a longer entry, saved by a server with longer streams, would not fit one of ours)
        needed = self._admission_cells(head, shared) + n_tokens
        if self.ledger.used_without(set(self.cache)) + needed > self.n_ctx:
            return None
        while self.cache and (self.ledger.used + needed > self.n_ctx or len(self.cache) >= self.cache_slots
                              or not self._free_seq_ids):
            self._evict(next(iter(self.cache)), "kv_cells" if self._free_seq_ids else "cache_slots")
        if self.ledger.used + needed > self.n_ctx or not self._free_seq_ids:
            return None
        return self._free_seq_ids.pop(0)

    def adopt_entry(self: Scheduler, seq_id: int, tokens: tuple[int, ...]) -> None:
        """`seq_id` (from `reserve_entry`) now holds positions [0, len(tokens)) of `tokens`: a cache entry."""
        self.ledger.grow(seq_id, len(tokens))
        self._insert_cache_entry(CacheEntry(seq_id, tokens))

    def release_entry(self: Scheduler, seq_id: int) -> None:
        """A reserved id whose load failed goes back (with a removal, should llama.cpp have kept any of it)."""
        self._release_seq_id(seq_id)
