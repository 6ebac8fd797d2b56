"""Admission: waiting sequences get a sequence id and start their prefill while a slot and the KV cells they need are
free, from the longest prefix the cache or a running sequence gives them; the cache is evicted (least recently used
first) to make that room. Fair between requests (`_next_head`): a request's extra choices never sit ahead of
another request's first sequence. Cache entries that come from outside the step loop (the persistent prefix
cache, engine/prefix_cache/disk.py) get their id and cells by the same rules. Pure, no llama.cpp."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from collections.abc import Sequence as Sequence_

from edge_llm.engine.scheduling.cached_prefixes import CachedPrefixes
from edge_llm.engine.scheduling.chunk_moves import ChunkMove, ChunkMoves
from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.sequence import CacheEntry, Phase, Sequence
from edge_llm.engine.scheduling.sharing import PrefixSharing

# A preempted sequence comes back only when every running sequence can then grow this many more tokens:
# resumed on the first free cells, it would be the newest again and the next victim within a step or two.
RESUME_STEPS = 16


class Admission:
    def __init__(self, *, parallel: int, max_preemptions: int, kv: KvBook, cached: CachedPrefixes,
                 sharing: PrefixSharing, moves: ChunkMoves, running: list[Sequence]) -> None:
        self.parallel = parallel
        self.max_preemptions = max_preemptions
        self.waiting: deque[Sequence] = deque()
        self._running = running  # the scheduler's list: admitted sequences are appended
        self._kv, self._cached, self._sharing, self._moves = kv, cached, sharing, moves

    def pinned_growth(self, other_than: Sequence | None = None) -> int:
        """Cells kept free for what pinned running sequences may still add."""
        return sum(s.growth_left for s in self._running if s.pinned(self.max_preemptions) and s is not other_than)

    def admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        while self.waiting and len(self._running) < self.parallel:
            head = _next_head(self.waiting, Counter(s.group for s in self._running))
            match = self._cached.best_prefix(head.feed) if head.use_cache else None
            moved = self._moves.movable(head, match, self._sharing.best_leader(head))
            if not self._make_room(head, match, moved):
                if match is None or not self._make_room(head, None, None):
                    break  # the head waits for running sequences to finish; nothing overtakes it for memory
                match, moved = self._cached.best_prefix(head.feed) if head.use_cache else None, None
            self.waiting.remove(head)
            head.phase = Phase.PREFILL
            lead = self._sharing.best_leader(head)
            if lead is not None and (match is None or lead[1] > match[1]):
                head.seq_id = self._kv.take_id()
                self._sharing.follow(head, *lead)
            elif match is not None and moved is not None:
                self._moves.take_over(head, *match, moved)
            else:
                head.seq_id = self._kv.take_id()
                if match is not None:
                    entry, length = match
                    self._kv.share_prefix(entry.seq_id, head, length)
                    self._cached.touch(entry.seq_id)
            self._running.append(head)
            admitted.append(head)
        return admitted

    def in_turn(self, count: int) -> list[Sequence]:
        """The next `count` waiting sequences in the order admission takes them (as long as each fits)."""
        waiting, running = list(self.waiting), Counter(s.group for s in self._running)
        chosen: list[Sequence] = []
        while waiting and len(chosen) < count:
            head = _next_head(waiting, running)
            waiting.remove(head)
            running[head.group] += 1
            chosen.append(head)
        return chosen

    def reusable_length(self, sequence: Sequence) -> int:
        """How much of a waiting sequence's feed the cache or a running leader would give it now."""
        match = self._cached.best_prefix(sequence.feed) if sequence.use_cache else None
        lead = self._sharing.best_leader(sequence)
        return max(match[1] if match else 0, lead[1] if lead else 0)

    def reserve_entry(self, head: Sequence, n_tokens: int, shared: int) -> int | None:
        """A free sequence id for a cache entry of `n_tokens` loaded from outside, which `head` will then take its
        first `shared` positions from, with the cells for both: least-recently-used entries are evicted as for an
        admission. None when only running sequences finishing could make room."""
        if self._cached.slots == 0 or n_tokens <= 0 or n_tokens > self._kv.sequence_context:
            return None  # (a longer entry, saved by a server with longer streams, would not fit one of ours)
        needed = self._admission_cells(head, shared) + n_tokens
        ledger, entries = self._kv.ledger, self._cached.entries
        if ledger.used_without(set(entries)) + needed > self._kv.n_ctx:
            return None
        while entries and (ledger.used + needed > self._kv.n_ctx or len(entries) >= self._cached.slots
                           or not self._kv.free_ids):
            slot_short = len(entries) >= self._cached.slots or not self._kv.free_ids
            self._cached.evict(next(iter(entries)), "cache_slots" if slot_short else "kv_cells")
        if ledger.used + needed > self._kv.n_ctx or not self._kv.free_ids:
            return None
        return self._kv.take_id()

    def _admission_cells(self, head: Sequence, shared: int) -> int:
        """Cells to keep free to admit `head`: what it computes of its feed, what running sequences still
        prefill, room for their next decode tokens (their next RESUME_STEPS when `head` was preempted), and
        what pinned sequences (the head too, if it is one) may add."""
        if head.pinned(self.max_preemptions):
            own = head.reserved - shared
        else:
            own = len(head.feed) - shared + 1  # its feed, and its next token
        steps = RESUME_STEPS if head.preemptions else 1
        return own + self._prompt_cells_to_come() + steps * len(self._running) + self.pinned_growth()

    def _prompt_cells_to_come(self) -> int:
        """Cells that running sequences still prefilling will fill with the rest of their feed."""
        return sum(len(s.feed) - max(s.n_past, s.shared) - (s.moved.length if s.moved else 0) for s in self._running
                   if s.phase is Phase.PREFILL and not s.pinned(self.max_preemptions))  # (a pinned one's: its growth)

    def _make_room(self, head: Sequence, protect: tuple[CacheEntry, int] | None, move: ChunkMove | None) -> bool:
        """Evicts least-recently-used cache entries until `head` fits and a sequence id is free. When `head` will
        take the protected entry over with a moved chunk, the entry counts as its prefix and the chunk, and the
        entries the move outdates as gone."""
        protected = protect[0].seq_id if protect else None
        lead = self._sharing.best_leader(head)
        shared = max(protect[1] if protect else 0, lead[1] if lead else 0)
        truncated: dict[int, int] = {}
        chunk, outdated = 0, set()
        if protect is not None and move is not None:
            chunk, outdated = move.length, set(move.outdated)
            shared, truncated = protect[1] + chunk, {protect[0].seq_id: protect[1]}
        needed = self._admission_cells(head, shared) + chunk
        entries, ledger, n_ctx = self._cached.entries, self._kv.ledger, self._kv.n_ctx
        evictable = {seq_id for seq_id in entries if seq_id != protected}
        if ledger.used_without(evictable, truncated) + needed > n_ctx:
            return False  # only running sequences finishing can make room: evicting the cache would not help
        while (ledger.used_without(outdated & set(entries), truncated) + needed > n_ctx
               or not self._kv.free_ids and not outdated & set(entries)):
            victim = self._cached.oldest(other_than=protected)
            if victim is None:
                return False
            self._cached.evict(victim, "kv_cells" if self._kv.free_ids else "cache_slots")
        return True


def _next_head(waiting: Sequence_[Sequence], running: Counter[Hashable]) -> Sequence:
    """The waiting sequence admitted next, when it fits (and none other while it does not): a preempted one first
    (they wait at the front, so they keep their turn); else the oldest waiting sequence of the request (`group`) with
    the fewest sequences `running`, ties to the request whose oldest waiting sequence came first. So the choices of an
    `n: 8` request queued ahead of another request take slots only while that one has as many running."""
    head = waiting[0]
    if head.preemptions:
        return head
    fewest = running[head.group]
    for sequence in waiting:
        if not fewest:
            break
        if running[sequence.group] < fewest:
            head, fewest = sequence, running[sequence.group]
    return head
