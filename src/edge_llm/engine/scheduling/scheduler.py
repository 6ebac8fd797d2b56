"""The batch scheduler: pure bookkeeping, no llama.cpp.

It decides, step by step, which tokens go into the next `llama_decode`: decode first (one token
for every running sequence), then prompt chunks of admitted sequences up to the batch size. It
admits waiting sequences while a sequence slot and KV cells are free, fairly between requests
(admission.py: the request with the fewest sequences running first, then FIFO), reuses cached prefixes
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

from collections import Counter
from collections.abc import Hashable

from edge_llm.engine.scheduling.admission import Admission
from edge_llm.engine.scheduling.cached_prefixes import CachedPrefixes
from edge_llm.engine.scheduling.chunk_moves import ChunkMoves
from edge_llm.engine.scheduling.draft_rows import lay_out_drafts
from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.sequence import CacheEntry, Phase, Sequence
from edge_llm.engine.scheduling.sharing import PrefixSharing
from edge_llm.engine.scheduling.step_plan import KvOp, KvTrim, StepPlan
from edge_llm.engine.speculative.speculation import Speculation, SpeculationStats
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost

MAX_PREEMPTIONS = 3


class RequestTooLargeError(ValueError):
    pass


class Scheduler:
    """The step loop's one object: it owns the running list and composes the parts (KV bookkeeping, the cache of
    prefixes, prefix sharing, chunk moves, admission); the engine thread and the persistent prefix cache call only
    its public methods."""

    def __init__(self, *, n_ctx: int, batch_size: int, parallel: int, cache_slots: int,
                 max_preemptions: int = MAX_PREEMPTIONS, step_cost: StepCost = CPU_STEP_COST,
                 stream_cells: int | None = None, last_token_in_chunk: bool = True) -> None:
        if batch_size < parallel:
            # Every running sequence's decode token must fit in one batch, or some would starve.
            raise ValueError(f"batch_size ({batch_size}) must be at least parallel ({parallel})")
        self.batch_size = batch_size
        self.parallel = parallel
        self.max_preemptions = max_preemptions
        self.step_cost = step_cost
        # False (--deterministic): a prompt's last token is never in a prefill chunk but decoded in a step of its own,
        # as a cached prompt's is; whether its row in a chunk gives the same logits there is not shown yet.
        self.last_token_in_chunk = last_token_in_chunk
        self.speculation = SpeculationStats()
        self.running: list[Sequence] = []  # in admission order: the last is the first to be preempted
        self.preemptions = 0  # read by other threads (an int)
        self.kv = KvBook(n_ctx=n_ctx, n_seq_max=parallel + cache_slots, stream_cells=stream_cells)
        self.cached = CachedPrefixes(self.kv, cache_slots)
        self.sharing = PrefixSharing(self.kv, self.running, max_preemptions)
        self.moves = ChunkMoves(self.kv, self.cached)
        self._admission = Admission(parallel=parallel, max_preemptions=max_preemptions, kv=self.kv,
                                    cached=self.cached, sharing=self.sharing, moves=self.moves, running=self.running)
        self.waiting = self._admission.waiting

    # ---- accounting -------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.kv.n_ctx

    @property
    def stream_cells(self) -> int | None:
        return self.kv.stream_cells

    @property
    def cache_slots(self) -> int:
        return self.cached.slots

    @property
    def cache(self) -> dict[int, CacheEntry]:
        """The cached prefixes by sequence id, least recently used first."""
        return self.cached.entries

    @property
    def evictions(self) -> dict[str, int]:
        return self.cached.evictions

    @property
    def n_seq_max(self) -> int:
        return self.parallel + self.cached.slots

    @property
    def sequence_context(self) -> int:
        """The most cells one sequence may fill."""
        return self.kv.sequence_context

    @property
    def kv_cells_used(self) -> int:
        """Distinct KV cells held by running sequences and cache entries, after the queued KV ops."""
        return self.kv.used

    @property
    def free_cells(self) -> int:
        return self.kv.free_cells

    def pinned(self, sequence: Sequence) -> bool:
        """Preempted often enough: re-admitted with room for its whole answer, never preempted again."""
        return sequence.pinned(self.max_preemptions)

    def pinned_growth(self) -> int:
        """Cells kept free for what pinned running sequences may still add."""
        return self._admission.pinned_growth()

    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- insert / remove ----------------------------------------------------------------

    def add(self, request_id: str, prompt: list[int], max_tokens: int, *, use_cache: bool = True,
            reuse_min: int = 0, speculative: bool = False, group: Hashable = None) -> Sequence:
        """Queues a sequence; `group` is the API request it answers (choices of one request share it; None: its own
        request), which admission is fair between."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_tokens > self.sequence_context or max_tokens < 1:
            raise RequestTooLargeError(
                f"{len(prompt)} prompt tokens + {max_tokens} new tokens exceed the context of {self.sequence_context}"
            )
        sequence = Sequence(request_id, list(prompt), max_tokens, request_id if group is None else group,
                            use_cache=use_cache, reuse_min=reuse_min)
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
        self.sharing.release_followers(sequence)
        self.moves.drop(sequence)
        if keep_in_cache and sequence.use_cache and self.cached.slots > 0 and sequence.n_past > 0:
            self.cached.insert(CacheEntry(sequence.seq_id, tuple(sequence.kv_tokens)))
            if self.kv.stream_cells is not None:
                self.cached.move_up(sequence.seq_id)
        else:
            self.kv.release(sequence.seq_id)

    def clear_cache(self) -> None:
        self.cached.clear()

    # ---- stepping -----------------------------------------------------------------------

    def step(self) -> StepPlan:
        """Admit what fits, make room for this step's tokens, then lay out the batch: decode tokens
        first, then prompt chunks (the one that ends a prompt with logits on its last row, sampled too)."""
        plan = StepPlan()
        plan.admitted = self._admission.admit()
        self.sharing.copy_ready_prefixes()
        plan.preempted = self._make_room_for_step()
        plan.kv_ops = self.kv.take_all_ops()
        for sequence in self.running:
            # A sequence that holds all of its feed but the last token (the rest taken from the prefix cache or a
            # leader, or computed up to there by a chunk the batch's room cut short) decodes that token in the
            # decode part, like a generated one. A chunk that reaches the feed's end carries it instead (below).
            if sequence.will_decode() and sequence.phase is Phase.PREFILL:
                sequence.phase = Phase.DECODE
                sequence.pending_token = sequence.feed[-1]
            if sequence.phase is Phase.DECODE and sequence.pending_token is not None:
                token = sequence.pending_token
                index = plan.add(token, sequence.n_past, sequence.seq_id, True)
                sequence.kv_tokens.append(token)
                sequence.n_past += 1
                sequence.pending_token = None
                self.kv.ledger.grow(sequence.seq_id, 1)
                plan.samples.append((sequence, index))
        # Drafts (speculative decoding) only in a step without prompt chunks, which is compute-bound (a draft row would
        # cost a whole token's time). Their cells are free ones, freed again before anything else is laid out.
        if not any(s.phase is Phase.PREFILL and s.leader is None for s in self.running):
            room = min(self.batch_size - len(plan.tokens), self.free_cells)
            for sequence, length in lay_out_drafts(plan, room, self.step_cost):
                self.kv.ledger.grow(sequence.seq_id, length)
        room = self.batch_size - len(plan.tokens)
        for sequence in self.running:
            if room <= 0:
                break
            if sequence.phase is not Phase.PREFILL or sequence.leader is not None:
                continue
            cells = self.free_cells - self._admission.pinned_growth(other_than=sequence)
            feed_end = len(sequence.feed) if self.last_token_in_chunk else len(sequence.feed) - 1
            end = min(sequence.n_past + room, sequence.n_past + max(cells, 0), feed_end)
            if sequence.moved is not None:
                end = min(end, sequence.moved.start)
            chunk = sequence.feed[sequence.n_past : end]
            # The chunk that reaches the feed's end carries its last token with logits, sampled after this
            # step's decode as llama-server does: the first token comes a step sooner than if the last token
            # waited for a step of its own behind the other prompts' chunks. With row-independent kernels
            # (--deterministic) that row's logits are the same as alone (docs/architecture.md, Repeatability).
            last = len(chunk) - 1 if end == len(sequence.feed) else -1
            for offset, token in enumerate(chunk):
                index = plan.add(token, sequence.n_past + offset, sequence.seq_id, offset == last)
            sequence.kv_tokens.extend(chunk)
            sequence.n_past += len(chunk)
            self.kv.ledger.grow(sequence.seq_id, len(chunk))
            self.moves.reach(sequence, self.kv.after_decode)
            plan.prefilled_tokens += len(chunk)
            room -= len(chunk)
            if last >= 0:
                sequence.phase = Phase.DECODE
                plan.samples.append((sequence, index))
        plan.undoable = not self.kv.after_decode
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
            taken_back = sequence.kv_tokens[sequence.n_past:]
            del sequence.kv_tokens[sequence.n_past:]
            self.kv.ledger.shrink(sequence.seq_id, count)
            self.kv.pending.append(KvTrim(sequence.seq_id, sequence.n_past))
            if sequence.speculation is not None:
                sequence.speculation.in_flight = ()
            # Back to what the step found: a prompt the step ended is still to be ended, a sampled token to decode.
            if sequence.n_past < len(sequence.feed):
                sequence.phase, sequence.pending_token = Phase.PREFILL, None
            else:
                sequence.pending_token = taken_back[0]

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
            self.kv.pending.append(KvTrim(sequence.seq_id, sequence.n_past))
            self.kv.ledger.shrink(sequence.seq_id, rejected)

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
            if self.cached.entries:
                self.cached.evict(next(iter(self.cached.entries)), "kv_cells")
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
        self.sharing.release_followers(sequence)
        self.moves.drop(sequence)
        self.kv.release(sequence.seq_id)
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

    # ---- KV ops and cache entries from outside the step loop (the persistent prefix cache) -------------------

    def take_pending_ops(self) -> list[KvOp]:
        """The ops queued since this step's were handed out, except those that must follow its decode: what
        `clear_cache` queued, for the engine's retry of a batch that found no KV cells."""
        return self.kv.take_pending_ops()

    def flush_ops(self) -> list[KvOp]:
        """Every queued KV op, in the order the next step would hand them out; only between a step's decode and the
        next step (then the ops that wait for a decode may go)."""
        return self.kv.take_all_ops()

    def in_turn(self, count: int) -> list[Sequence]:
        """The next `count` waiting sequences in the order admission takes them (as long as each fits)."""
        return self._admission.in_turn(count)

    def reusable_length(self, sequence: Sequence) -> int:
        """How much of a waiting sequence's feed the cache or a running leader would give it now."""
        return self._admission.reusable_length(sequence)

    def reserve_entry(self, head: Sequence, n_tokens: int, shared: int) -> int | None:
        """A free sequence id, with its cells, for a cache entry of `n_tokens` loaded from outside that `head` will
        take `shared` positions from (None: no room now). The caller applies `flush_ops()` before it fills the id,
        then calls `adopt_entry` or `release_entry`."""
        return self._admission.reserve_entry(head, n_tokens, shared)

    def adopt_entry(self, seq_id: int, tokens: tuple[int, ...]) -> None:
        """`seq_id` (from `reserve_entry`) now holds positions [0, len(tokens)) of `tokens`: a cache entry."""
        self.kv.ledger.grow(seq_id, len(tokens))
        self.cached.insert(CacheEntry(seq_id, tokens))

    def release_entry(self, seq_id: int) -> None:
        """A reserved id whose load failed goes back (with a removal, should llama.cpp have kept any of it)."""
        self.kv.release(seq_id)
