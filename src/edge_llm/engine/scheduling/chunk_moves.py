"""The scheduler's `--cache-reuse` moves (llama-server's KV shifting): a waiting prompt that matches a cache entry
up to an edit, then again after it (a keystroke in an editor, then the unchanged rest of the file), takes the
entry over; the chunk after the edit is held by a spare sequence id while the edit is computed, then shifted to
its new positions instead of being recomputed. Pure bookkeeping, no llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_llm.engine.scheduling.cached_prefixes import CachedPrefixes
from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.sequence import CacheEntry, MovedChunk, Sequence
from edge_llm.engine.scheduling.step_plan import KvCopy, KvOp, KvRemove, KvShift, KvTrim
from edge_llm.engine.scheduling.token_match import moved_chunk


@dataclass(frozen=True)
class ChunkMove:
    """A planned move: the entry's chunk at `old_start` goes to `start`; the cache entries in `outdated` share its
    cells (earlier keystrokes of the same file) and are evicted when the move is made."""

    old_start: int
    start: int
    length: int
    outdated: frozenset[int]


class ChunkMoves:
    def __init__(self, kv: KvBook, cached: CachedPrefixes) -> None:
        self._kv = kv
        self._cached = cached

    def movable(self, head: Sequence, match: tuple[CacheEntry, int] | None,
                lead: tuple[Sequence, int] | None) -> ChunkMove | None:
        """The chunk of the matched entry's tokens after their common prefix that reappears in the rest of `head`'s
        feed, when it is long enough and no running sequence shares its cells; None otherwise (also when `lead`, the
        running sequence `head` would follow, shares more). Changes nothing."""
        if match is None or head.reuse_min <= 0 or head.preemptions:
            return None
        entry, length = match
        if lead is not None and lead[1] > length:
            return None  # a running sequence shares more: head follows it instead
        found = moved_chunk(entry.tokens, head.feed, length, len(head.feed) - 1, head.reuse_min)
        if found is None:
            return None
        others = self._kv.ledger.other_holders_from(entry.seq_id, found[0])
        if not others <= set(self._cached.entries):
            return None  # a running sequence shares the chunk's cells: they cannot move under it
        return ChunkMove(*found, outdated=frozenset(others))

    def take_over(self, head: Sequence, entry: CacheEntry, length: int, move: ChunkMove) -> None:
        """`head` takes the entry's sequence over: it keeps the prefix, a spare sequence holds the chunk while the
        edit before it is computed, and then the chunk is moved to its new positions (`reach`)."""
        for seq_id in move.outdated & set(self._cached.entries):  # moving the chunk outdates them
            self._cached.evict(seq_id, "moved_chunk")
        self._cached.take(entry.seq_id)
        head.seq_id = entry.seq_id
        holder = self._kv.take_id()
        self._kv.pending += [KvCopy(entry.seq_id, holder, start=move.old_start, end=move.old_start + move.length),
                             KvTrim(entry.seq_id, length)]
        self._kv.ledger.truncate(entry.seq_id, length)
        self._kv.ledger.grow(holder, move.length)
        head.kv_tokens = list(head.feed[:length])
        head.n_past = length
        head.cached_tokens = length + move.length
        head.moved_tokens = move.length if move.start != move.old_start else 0
        head.moved = MovedChunk(holder, move.old_start, move.start, move.length)
        self.reach(head, self._kv.pending)

    def reach(self, sequence: Sequence, ops: list[KvOp]) -> None:
        """Once the prefill reaches a moved chunk's new start, the chunk moves there (`ops`: before the next decode,
        or after this step's when the step's batch holds the tokens before it) and counts as computed."""
        moved = sequence.moved
        if moved is None or sequence.n_past != moved.start:
            return
        end = moved.start + moved.length
        if moved.start != moved.old_start:
            ops.append(KvShift(moved.holder, moved.old_start, moved.old_start + moved.length,
                               moved.start - moved.old_start))
        ops.append(KvCopy(moved.holder, sequence.seq_id, start=moved.start, end=end))
        ops.append(KvRemove(moved.holder))
        self._kv.release(moved.holder, queue_removal=False)
        self._kv.ledger.grow(sequence.seq_id, moved.length)
        sequence.kv_tokens.extend(sequence.feed[moved.start:end])
        sequence.n_past = end
        sequence.moved = None

    def drop(self, sequence: Sequence) -> None:
        """`sequence` leaves before its prefill reached its moved chunk: the holder lets the chunk go."""
        if sequence.moved is not None:
            self._kv.release(sequence.moved.holder)
            sequence.moved = None
