"""Finished sequences kept in the KV cache for their prefixes (the in-memory prefix cache): least recently used
first, an entry covered by a newer one dropped, evictions counted by reason. Pure, no llama.cpp."""

from __future__ import annotations

from collections import OrderedDict

from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.sequence import CacheEntry
from edge_llm.engine.scheduling.step_plan import KvCopy
from edge_llm.engine.scheduling.token_match import common_prefix_length

EVICTION_REASONS = ("cache_slots", "kv_cells", "covered", "cleared", "moved_chunk")


class CachedPrefixes:
    def __init__(self, kv: KvBook, slots: int) -> None:
        self._kv = kv
        self.slots = slots
        self.entries: OrderedDict[int, CacheEntry] = OrderedDict()  # seq_id → entry, least recent first
        self.evictions: dict[str, int] = dict.fromkeys(EVICTION_REASONS, 0)  # read by other threads

    def __len__(self) -> int:
        return len(self.entries)

    def oldest(self, other_than: int | None = None) -> int | None:
        return next((seq_id for seq_id in self.entries if seq_id != other_than), None)

    def evict(self, seq_id: int, reason: str) -> None:
        del self.entries[seq_id]
        self.evictions[reason] += 1
        self._kv.release(seq_id)

    def clear(self) -> None:
        while self.entries:
            self.evict(next(iter(self.entries)), "cleared")

    def touch(self, seq_id: int) -> None:
        self.entries.move_to_end(seq_id)

    def take(self, seq_id: int) -> CacheEntry:
        """The entry leaves the cache with its cells: a sequence takes it over."""
        return self.entries.pop(seq_id)

    def best_prefix(self, prompt: list[int]) -> tuple[CacheEntry, int] | None:
        best: tuple[CacheEntry, int] | None = None
        for entry in self.entries.values():
            # At least the last prompt token is decoded again: its logits give the first sample.
            length = min(common_prefix_length(entry.tokens, prompt), len(prompt) - 1)
            if length > 0 and (best is None or length > best[1]):
                best = (entry, length)
        return best

    def insert(self, entry: CacheEntry) -> None:
        """`entry` (its id's cells in the ledger) joins the cache, unless an entry already covers it."""
        for seq_id, other in list(self.entries.items()):
            if other.tokens == entry.tokens[: len(other.tokens)]:
                self.evict(seq_id, "covered")  # the new entry holds everything the old one did
            elif entry.tokens == other.tokens[: len(entry.tokens)]:
                self._kv.release(entry.seq_id)  # an existing entry already covers this one
                self.touch(seq_id)
                return
        self.entries[entry.seq_id] = entry
        while len(self.entries) > self.slots:
            self.evict(next(iter(self.entries)), "cache_slots")

    def move_up(self, seq_id: int) -> None:
        """With a KV stream per sequence llama.cpp batches only consecutive ids together, and sequences are admitted
        on the lowest free ids: a new cache entry moves to the highest free id (a copy of its stream, a few MB), so the
        id it leaves goes to the next admission, beside the running ones."""
        free = self._kv.free_ids
        if seq_id not in self.entries or not free or free[-1] < seq_id:
            return
        entry = self.entries.pop(seq_id)
        target = free.pop()
        self._kv.pending.append(KvCopy(seq_id, target, len(entry.tokens)))
        self._kv.ledger.grow(target, len(entry.tokens))
        self._kv.release(seq_id)
        self.entries[target] = CacheEntry(target, entry.tokens)  # the newest entry still, at the end
