"""The batch scheduler: pure bookkeeping, no llama.cpp.

It decides, step by step, which tokens go into the next `llama_decode`: decode first (one token
for every running sequence), then prompt chunks of admitted sequences up to the batch size. It
admits waiting requests FIFO while a sequence slot and KV cells are free, reuses cached prefixes
of finished sequences, and evicts those cache entries least-recently-used when their cells are
needed.

KV cells are charged as they are filled, not reserved up front (`KvLedger`: cells shared by
`seq_cp` count once). When a step needs more cells than are free, the prefix cache is evicted
(LRU) first; then the most recently admitted running sequence is preempted: its cells are freed,
it goes back to the head of the queue and later recomputes its prompt plus what it has generated
(vLLM's recompute preemption), so its answer goes on where it stopped. A sequence preempted
`max_preemptions` times is re-admitted only with room reserved for its whole answer and is never
preempted again, so none starves.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict, deque

from edge_llm.engine.scheduling.kv_ledger import KvLedger
from edge_llm.engine.scheduling.scheduler_entries import OutsideEntries
from edge_llm.engine.scheduling.scheduler_moves import ChunkMove, ChunkMoves
from edge_llm.engine.scheduling.step_plan import KvCopy, KvOp, KvRemove, KvTrim, StepPlan
from edge_llm.engine.scheduling.sequence import CacheEntry, Phase, Sequence
from edge_llm.engine.speculative.speculation import Speculation, SpeculationStats, lay_out_drafts
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost
from edge_llm.engine.scheduling.token_match import common_prefix_length

MAX_PREEMPTIONS = 3
# A preempted sequence comes back only when every running sequence can then grow this many more tokens:
# resumed on the first free cells, it would be the newest again and the next victim within a step or two.
RESUME_STEPS = 16
EVICTION_REASONS = ("cache_slots", "kv_cells", "covered", "cleared", "moved_chunk")

MIN_SHARED_PREFIX = 8  # shorter common prefixes with running sequences are not worth waiting for


class RequestTooLargeError(ValueError):
    pass


class Scheduler(OutsideEntries, ChunkMoves):
    def __init__(self, *, n_ctx: int, batch_size: int, parallel: int, cache_slots: int,
                 max_preemptions: int = MAX_PREEMPTIONS, step_cost: StepCost = CPU_STEP_COST,
                 stream_cells: int | None = None) -> None:
        if batch_size < parallel:
            # Every running sequence's decode token must fit in one batch, or some would starve.
            raise ValueError(f"batch_size ({batch_size}) must be at least parallel ({parallel})")
        self.n_ctx = n_ctx
        # With a KV stream per sequence (--deterministic) a sequence holds at most `stream_cells` cells, and a copied
        # prefix is the destination's own cells (a copy of the data, not shared cells): the ledger charges it so.
        self.stream_cells = stream_cells
        self.batch_size = batch_size
        self.parallel = parallel
        self.cache_slots = cache_slots
        self.max_preemptions = max_preemptions
        self.step_cost = step_cost
        self.speculation = SpeculationStats()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is the first to be preempted
        self.cache: OrderedDict[int, CacheEntry] = OrderedDict()  # seq_id → entry, least recent first
        self.ledger = KvLedger()
        self.preemptions = 0  # counters, read by other threads (ints, and a dict whose keys never change)
        self.evictions: dict[str, int] = dict.fromkeys(EVICTION_REASONS, 0)
        self._free_seq_ids: list[int] = list(range(parallel + cache_slots))
        self._pending_ops: list[KvOp] = []
        # Ops that must wait until this step's batch is decoded (a moved chunk joins its sequence after the tokens
        # before it): they go first in the next step's.
        self._after_decode_ops: list[KvOp] = []

    # ---- accounting -------------------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        return self.parallel + self.cache_slots

    @property
    def sequence_context(self) -> int:
        """The most cells one sequence may fill."""
        return self.n_ctx if self.stream_cells is None else self.stream_cells

    @property
    def kv_cells_used(self) -> int:
        """Distinct KV cells held by running sequences and cache entries, after the queued KV ops."""
        return self.ledger.used

    @property
    def free_cells(self) -> int:
        return self.n_ctx - self.ledger.used

    @property
    def active_kv_tokens(self) -> int:
        return sum(s.n_past for s in self.running) + sum(len(e.tokens) for e in self.cache.values())

    def pinned(self, sequence: Sequence) -> bool:
        """Preempted often enough: re-admitted with room for its whole answer, never preempted again."""
        return sequence.preemptions >= self.max_preemptions

    def _pinned_growth(self, other_than: Sequence | None = None) -> int:
        """Cells kept free for what pinned running sequences may still add."""
        return sum(s.growth_left for s in self.running if self.pinned(s) and s is not other_than)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- insert / remove ----------------------------------------------------------------

    def add(self, request_id: str, prompt: list[int], max_tokens: int, *, use_cache: bool = True,
            reuse_min: int = 0, speculative: bool = False) -> Sequence:
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_tokens > self.sequence_context or max_tokens < 1:
            raise RequestTooLargeError(
                f"{len(prompt)} prompt tokens + {max_tokens} new tokens exceed the context of {self.sequence_context}"
            )
        sequence = Sequence(request_id, list(prompt), max_tokens, use_cache=use_cache, reuse_min=reuse_min)
        sequence.feed = sequence.prompt
        if speculative:
            sequence.speculation = Speculation()
        self.waiting.append(sequence)
        return sequence

    def remove(self, sequence: Sequence, *, keep_in_cache: bool = False) -> None:
        """A sequence leaves (finished or cancelled) and its slot is freed at once."""
        if sequence.phase is Phase.WAITING:
            try:
                self.waiting.remove(sequence)
            except ValueError:
                pass
            return
        if sequence not in self.running:
            return
        self.running.remove(sequence)
        self._release_followers(sequence)
        self._drop_moved_chunk(sequence)
        if keep_in_cache and sequence.use_cache and self.cache_slots > 0 and sequence.n_past > 0:
            self._insert_cache_entry(CacheEntry(sequence.seq_id, tuple(sequence.kv_tokens)))
            if self.stream_cells is not None and sequence.seq_id in self.cache:
                self._move_entry_up(sequence.seq_id)
        else:
            self._release_seq_id(sequence.seq_id)

    def _move_entry_up(self, seq_id: int) -> None:
        """With a KV stream per sequence llama.cpp batches only consecutive ids together, and sequences are admitted
        on the lowest free ids: a new cache entry moves to the highest free id (a copy of its stream, a few MB), so the
        id it leaves goes to the next admission, beside the running ones."""
        if not self._free_seq_ids or self._free_seq_ids[-1] < seq_id:
            return
        entry = self.cache.pop(seq_id)
        target = self._free_seq_ids.pop()
        self._pending_ops.append(KvCopy(seq_id, target, len(entry.tokens)))
        self.ledger.grow(target, len(entry.tokens))
        self._release_seq_id(seq_id)
        self.cache[target] = CacheEntry(target, entry.tokens)  # the newest entry still, at the end

    def clear_cache(self) -> None:
        while self.cache:
            self._evict(next(iter(self.cache)), "cleared")

    # ---- stepping -----------------------------------------------------------------------

    def step(self) -> StepPlan:
        """Admit what fits, make room for this step's tokens, then lay out the batch: decode tokens
        first, then prompt chunks."""
        plan = StepPlan()
        plan.admitted = self._admit()
        for sequence in self.running:
            if sequence.leader is not None and sequence.leader.n_past >= sequence.shared:
                self._copy_from_leader(sequence)
        plan.preempted = self._make_room_for_step()
        plan.kv_ops, self._pending_ops = self._after_decode_ops + self._pending_ops, []
        self._after_decode_ops = []
        for sequence in self.running:
            # The last prompt token is decoded on its own, like a generated one, never inside a prefill
            # chunk, whether the rest of the prompt was computed now or taken from the prefix cache. That
            # alone does not make a temperature-0 or seeded answer repeatable: cached KV was computed in another
            # batch layout and batch mates change this batch, so the logits differ in rounding, unless the
            # kernels compute each row alone (--deterministic: docs/architecture.md, Repeatability).
            if sequence.will_decode() and sequence.phase is Phase.PREFILL:
                sequence.phase = Phase.DECODE
                sequence.pending_token = sequence.feed[-1]
            if sequence.phase is Phase.DECODE and sequence.pending_token is not None:
                token = sequence.pending_token
                index = plan.add(token, sequence.n_past, sequence.seq_id, True)
                sequence.kv_tokens.append(token)
                sequence.n_past += 1
                sequence.pending_token = None
                self.ledger.grow(sequence.seq_id, 1)
                plan.samples.append((sequence, index))
        # Drafts (speculative decoding) only in a step without prompt chunks, which is compute-bound (a draft row would
        # cost a whole token's time). Their cells are free ones, freed again before anything else is laid out.
        if not any(s.phase is Phase.PREFILL and s.leader is None for s in self.running):
            room = min(self.batch_size - len(plan.tokens), self.free_cells)
            for sequence, length in lay_out_drafts(plan, room, self.step_cost):
                self.ledger.grow(sequence.seq_id, length)
        room = self.batch_size - len(plan.tokens)
        for sequence in self.running:
            if room <= 0:
                break
            if sequence.phase is not Phase.PREFILL or sequence.leader is not None:
                continue
            cells = self.free_cells - self._pinned_growth(other_than=sequence)
            end = min(sequence.n_past + room, sequence.n_past + max(cells, 0), len(sequence.feed) - 1)
            if sequence.moved is not None:
                end = min(end, sequence.moved.start)
            chunk = sequence.feed[sequence.n_past : end]
            for offset, token in enumerate(chunk):
                plan.add(token, sequence.n_past + offset, sequence.seq_id, False)
            sequence.kv_tokens.extend(chunk)
            sequence.n_past += len(chunk)
            self.ledger.grow(sequence.seq_id, len(chunk))
            self._reach_moved_chunk(sequence, self._after_decode_ops)
            plan.prefilled_tokens += len(chunk)
            room -= len(chunk)
        plan.undoable = not self._after_decode_ops
        return plan

    def undo_step(self, plan: StepPlan) -> None:
        """The step's decode was stopped part-way (every request in it was cancelled): its rows were each sequence's
        last positions, and llama.cpp keeps none of them, or only those of the micro-batches it finished; each
        sequence lets them go, so what it holds, and the cache entry it becomes, is what the KV cache holds."""
        assert plan.undoable, "a step whose moved chunk follows its decode cannot be taken back"
        rows = Counter(plan.seq_ids)
        for sequence in self.running:
            count = rows.get(sequence.seq_id, 0)
            if not count:
                continue
            sequence.n_past -= count
            del sequence.kv_tokens[sequence.n_past:]
            self.ledger.shrink(sequence.seq_id, count)
            self._pending_ops.append(KvTrim(sequence.seq_id, sequence.n_past))
            if sequence.speculation is not None:
                sequence.speculation.in_flight = ()

    def on_sampled(self, sequence: Sequence, token: int) -> None:
        """The engine sampled `token` for `sequence`; it is decoded in the next step."""
        sequence.output.append(token)
        sequence.pending_token = token

    def settle_draft(self, sequence: Sequence, accepted: int) -> None:
        """`sequence`'s draft in this step's batch was verified before its tokens are passed to `on_sampled`: the
        cells of its first `accepted` tokens stay, the rest are freed (trimmed before the next decode)."""
        speculation = sequence.speculation
        assert speculation is not None and 0 <= accepted <= len(speculation.in_flight)
        rejected = len(speculation.in_flight) - accepted
        self.speculation.record(len(speculation.in_flight), accepted)
        speculation.verified(accepted)
        if rejected and sequence in self.running:
            sequence.n_past -= rejected
            del sequence.kv_tokens[sequence.n_past:]
            self._pending_ops.append(KvTrim(sequence.seq_id, sequence.n_past))
            self.ledger.shrink(sequence.seq_id, rejected)

    # ---- room for a step: evict the cache, then preempt --------------------------------------

    def _cells_needed(self) -> int:
        """Cells this step must have: one per decode token, or one prefill token when nothing decodes,
        so that every step makes progress."""
        decoding = sum(1 for s in self.running if s.will_decode())
        if decoding:
            return decoding
        return 1 if any(s.phase is Phase.PREFILL and s.leader is None for s in self.running) else 0

    def _make_room_for_step(self) -> list[Sequence]:
        preempted: list[Sequence] = []
        while self.free_cells < self._cells_needed():
            if self.cache:
                self._evict(next(iter(self.cache)), "kv_cells")
                continue
            victim = self._preemption_victim()
            if victim is None:
                break  # cannot happen while every request fits the context alone; the decode reports it
            self._preempt(victim)
            preempted.append(victim)
        return preempted

    def _preemption_victim(self) -> Sequence | None:
        if len(self.running) < 2:
            return None  # a sequence alone always fits: preempting it would only start it over
        candidates = [s for s in self.running if not self.pinned(s)] or self.running[1:]
        return candidates[-1]

    def _preempt(self, sequence: Sequence) -> None:
        """Frees `sequence`'s cells and puts it back first in the queue, to recompute what it had."""
        self.running.remove(sequence)
        self._release_followers(sequence)
        self._drop_moved_chunk(sequence)
        self._release_seq_id(sequence.seq_id)
        if not sequence.preemptions:
            sequence.generated_at_first_preemption = sequence.generated
        sequence.preemptions += 1
        self.preemptions += 1
        sequence.feed = sequence.prompt + sequence.output
        sequence.phase = Phase.WAITING
        sequence.seq_id = -1
        sequence.n_past = 0
        sequence.kv_tokens = []
        sequence.pending_token = None
        sequence.leader = None
        sequence.shared = 0
        self.waiting.appendleft(sequence)

    # ---- admission and the prefix cache ---------------------------------------------------

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.parallel:
            head = self.waiting[0]
            match = self._best_prefix(head.feed) if head.use_cache else None
            moved = self._movable_chunk(head, match)
            if not self._make_room(head, match, moved):
                if match is None or not self._make_room(head, None, None):
                    break  # FIFO: the head waits for running sequences to finish; nothing overtakes it
                match, moved = self._best_prefix(head.feed) if head.use_cache else None, None
            self.waiting.popleft()
            head.phase = Phase.PREFILL
            lead = self._best_running_prefix(head)
            if lead is not None and (match is None or lead[1] > match[1]):
                head.seq_id = self._free_seq_ids.pop(0)
                head.leader, head.shared = lead
                if head.leader.n_past >= head.shared:
                    self._copy_from_leader(head)
            elif match is not None and moved is not None:
                self._take_over_with_moved_chunk(head, *match, moved)
            else:
                head.seq_id = self._free_seq_ids.pop(0)
                if match is not None:
                    entry, length = match
                    self._queue_copy(entry.seq_id, head, length)
                    self.cache.move_to_end(entry.seq_id)
            self.running.append(head)
            admitted.append(head)
        return admitted

    def _admission_cells(self, head: Sequence, shared: int) -> int:
        """Cells to keep free to admit `head`: what it computes of its feed, what running sequences still
        prefill, room for their next decode tokens (their next RESUME_STEPS when `head` was preempted), and
        what pinned sequences (the head too, if it is one) may add."""
        if self.pinned(head):
            own = head.reserved - shared
        else:
            own = len(head.feed) - shared + 1  # its feed, and its next token
        steps = RESUME_STEPS if head.preemptions else 1
        return own + self._prompt_cells_to_come() + steps * len(self.running) + self._pinned_growth()

    def _prompt_cells_to_come(self) -> int:
        """Cells that running sequences still prefilling will fill with the rest of their feed."""
        return sum(len(s.feed) - max(s.n_past, s.shared) - (s.moved.length if s.moved else 0) for s in self.running
                   if s.phase is Phase.PREFILL and not self.pinned(s))  # (a pinned one's is in its growth)

    def _make_room(self, head: Sequence, protect: tuple[CacheEntry, int] | None, move: ChunkMove | None) -> bool:
        """Evicts least-recently-used cache entries until `head` fits and a sequence id is free. When `head` will
        take the protected entry over with a moved chunk, the entry counts as its prefix and the chunk, and the
        entries the move outdates as gone."""
        protected = protect[0].seq_id if protect else None
        lead = self._best_running_prefix(head)
        shared = max(protect[1] if protect else 0, lead[1] if lead else 0)
        truncated: dict[int, int] = {}
        chunk, outdated = 0, set()
        if protect is not None and move is not None:
            chunk, outdated = move.length, set(move.outdated)
            shared, truncated = protect[1] + chunk, {protect[0].seq_id: protect[1]}
        needed = self._admission_cells(head, shared) + chunk
        evictable = {seq_id for seq_id in self.cache if seq_id != protected}
        if self.ledger.used_without(evictable, truncated) + needed > self.n_ctx:
            return False  # only running sequences finishing can make room: evicting the cache would not help
        while (self.ledger.used_without(outdated & set(self.cache), truncated) + needed > self.n_ctx
               or not self._free_seq_ids and not outdated & set(self.cache)):
            victim = next((seq_id for seq_id in self.cache if seq_id != protected), None)
            if victim is None:
                return False
            self._evict(victim, "kv_cells" if self._free_seq_ids else "cache_slots")
        return True

    def _best_prefix(self, prompt: list[int]) -> tuple[CacheEntry, int] | None:
        best: tuple[CacheEntry, int] | None = None
        for entry in self.cache.values():
            # At least the last prompt token is decoded again: its logits give the first sample.
            length = min(common_prefix_length(entry.tokens, prompt), len(prompt) - 1)
            if length > 0 and (best is None or length > best[1]):
                best = (entry, length)
        return best

    def _best_running_prefix(self, head: Sequence) -> tuple[Sequence, int] | None:
        if self.pinned(head) or not head.use_cache:
            return None  # a pinned one's room is counted without the leader's cells, which a preemption could take
        best: tuple[Sequence, int] | None = None
        prompt = head.feed
        for sequence in self.running:
            length = min(common_prefix_length(sequence.known_tokens(), prompt), len(prompt) - 1)
            if length >= MIN_SHARED_PREFIX and (best is None or length > best[1]):
                best = (sequence, length)
        return best

    def _queue_copy(self, src_seq: int, dst: Sequence, length: int) -> None:
        self._pending_ops.append(KvCopy(src_seq, dst.seq_id, length))
        if self.stream_cells is None:
            self.ledger.copy(src_seq, dst.seq_id, length)
        else:
            self.ledger.grow(dst.seq_id, length)
        dst.kv_tokens = list(dst.feed[:length])
        dst.n_past = length
        if dst.preemptions == 0:
            dst.cached_tokens = min(length, len(dst.prompt))

    def _copy_from_leader(self, follower: Sequence) -> None:
        leader, length = follower.leader, follower.shared
        assert leader is not None
        self._queue_copy(leader.seq_id, follower, length)
        follower.leader = None

    def _release_followers(self, leader: Sequence) -> None:
        """A leader leaves: followers take what it has computed, or prefill by themselves."""
        for sequence in self.running:
            if sequence.leader is leader:
                if leader.n_past >= sequence.shared:
                    self._copy_from_leader(sequence)
                else:
                    sequence.leader = None

    def _insert_cache_entry(self, entry: CacheEntry) -> None:
        for seq_id, other in list(self.cache.items()):
            if other.tokens == entry.tokens[: len(other.tokens)]:
                self._evict(seq_id, "covered")  # the new entry holds everything the old one did
            elif entry.tokens == other.tokens[: len(entry.tokens)]:
                self._release_seq_id(entry.seq_id)  # an existing entry already covers this one
                self.cache.move_to_end(seq_id)
                return
        self.cache[entry.seq_id] = entry
        while len(self.cache) > self.cache_slots:
            self._evict(next(iter(self.cache)), "cache_slots")

    def _evict(self, seq_id: int, reason: str) -> None:
        del self.cache[seq_id]
        self.evictions[reason] += 1
        self._release_seq_id(seq_id)

    def _release_seq_id(self, seq_id: int, *, queue_removal: bool = True) -> None:
        if seq_id < 0:
            return
        if queue_removal:
            self._pending_ops.append(KvRemove(seq_id))
        self.ledger.drop(seq_id)
        # The lowest free id is taken next: with a KV stream per sequence llama.cpp batches only consecutive ids
        # together, so running sequences are best kept on low, adjacent ids.
        bisect.insort(self._free_seq_ids, seq_id)

    def take_pending_ops(self) -> list[KvOp]:
        """The ops queued since this step's were handed out, except those that must follow its decode: what
        `clear_cache` queued, for the engine's retry of a batch that found no KV cells."""
        ops, self._pending_ops = self._pending_ops, []
        return ops

    def sequence_count(self) -> int:
        return len(self.running) + len(self.waiting)
