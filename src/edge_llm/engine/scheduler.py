"""The batch scheduler: pure bookkeeping, no llama.cpp.

It decides, step by step, which tokens go into the next `llama_decode`:
decode first (one token for every running sequence), then prompt chunks of admitted
sequences up to the batch size. It admits waiting requests FIFO while a sequence slot
and KV budget are free, reuses cached prefixes of finished sequences, and evicts
those cache entries least-recently-used when their cells are needed.

KV budget: every sequence is charged for every position it may hold (an active one for
prompt + max_tokens, a cache entry for its tokens). Cells shared by `seq_cp` are charged
to each holder, so the sum is an upper bound of the cells really in use and a decode can
never run out of cells.
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt: list[int]
    max_tokens: int
    phase: Phase = Phase.WAITING
    seq_id: int = -1
    n_past: int = 0  # positions of this sequence already in the KV cache
    cached_tokens: int = 0  # prompt positions reused from the prefix cache
    generated: int = 0
    pending_token: int | None = None  # sampled, not yet decoded
    kv_tokens: list[int] = field(default_factory=list)  # the tokens at positions 0..n_past-1
    # A follower shares its first `shared` prompt positions with a running `leader` still prefilling
    # them; it copies them (KvCopy) once the leader has, instead of computing them twice.
    leader: Sequence | None = None
    shared: int = 0

    def known_tokens(self) -> list[int]:
        """The tokens this sequence's KV holds or will hold once its prompt is prefilled."""
        return self.prompt if self.phase is Phase.PREFILL else self.kv_tokens

    @property
    def reserved(self) -> int:
        return len(self.prompt) + self.max_tokens


@dataclass(eq=False)
class CacheEntry:
    seq_id: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class KvCopy:
    src_seq: int
    dst_seq: int
    length: int  # positions [0, length)


@dataclass(frozen=True)
class KvRemove:
    seq_id: int


KvOp = KvCopy | KvRemove


@dataclass
class StepPlan:
    kv_ops: list[KvOp] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)
    samples: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, batch index)
    admitted: list[Sequence] = field(default_factory=list)
    prefilled_tokens: int = 0

    @property
    def empty(self) -> bool:
        return not self.tokens

    def add(self, token: int, position: int, seq_id: int, want_logits: bool) -> int:
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_id)
        self.logits.append(want_logits)
        return len(self.tokens) - 1


MIN_SHARED_PREFIX = 8  # shorter common prefixes with running sequences are not worth waiting for


class RequestTooLargeError(ValueError):
    pass


def common_prefix_length(a: tuple[int, ...] | list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(self, *, n_ctx: int, batch_size: int, parallel: int, cache_slots: int) -> None:
        if batch_size < parallel:
            # Every running sequence's decode token must fit in one batch, or some would starve.
            raise ValueError(f"batch_size ({batch_size}) must be at least parallel ({parallel})")
        self.n_ctx = n_ctx
        self.batch_size = batch_size
        self.parallel = parallel
        self.cache_slots = cache_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache: OrderedDict[int, CacheEntry] = OrderedDict()  # seq_id → entry, least recent first
        self._free_seq_ids: list[int] = list(range(parallel + cache_slots))
        self._pending_ops: list[KvOp] = []

    # ---- accounting -------------------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        return self.parallel + self.cache_slots

    @property
    def reserved_cells(self) -> int:
        return sum(s.reserved for s in self.running) + sum(len(e.tokens) for e in self.cache.values())

    @property
    def active_kv_tokens(self) -> int:
        return sum(s.n_past for s in self.running) + sum(len(e.tokens) for e in self.cache.values())

    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- insert / remove ----------------------------------------------------------------

    def add(self, request_id: str, prompt: list[int], max_tokens: int) -> Sequence:
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_tokens > self.n_ctx or max_tokens < 1:
            raise RequestTooLargeError(
                f"{len(prompt)} prompt tokens + {max_tokens} new tokens exceed the context of {self.n_ctx}"
            )
        sequence = Sequence(request_id, list(prompt), max_tokens)
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
        if keep_in_cache and self.cache_slots > 0 and sequence.n_past > 0:
            self._insert_cache_entry(CacheEntry(sequence.seq_id, tuple(sequence.kv_tokens)))
        else:
            self._release_seq_id(sequence.seq_id)

    def clear_cache(self) -> None:
        while self.cache:
            self._evict_oldest()

    # ---- stepping -----------------------------------------------------------------------

    def step(self) -> StepPlan:
        """Admit what fits, then lay out the next batch: decode tokens first, then prompt chunks."""
        plan = StepPlan()
        plan.admitted = self._admit()
        for sequence in self.running:
            if sequence.leader is not None and sequence.leader.n_past >= sequence.shared:
                self._copy_from_leader(sequence)
        plan.kv_ops, self._pending_ops = self._pending_ops, []
        for sequence in self.running:
            # The last prompt token is decoded on its own, like a generated one, never inside a prefill
            # chunk, whether the rest of the prompt was computed now or taken from the prefix cache. That
            # does not make a temperature-0 or seeded answer repeatable: cached KV was computed in another
            # batch layout and batch mates change this batch, so the logits differ in rounding. Only a
            # request that runs alone without the prefix cache (--parallel 1 --cache-slots 0) repeats
            # exactly (docs/architecture.md, Repeatability; issue #18).
            if sequence.phase is Phase.PREFILL and sequence.leader is None \
                    and sequence.n_past == len(sequence.prompt) - 1:
                sequence.phase = Phase.DECODE
                sequence.pending_token = sequence.prompt[-1]
            if sequence.phase is Phase.DECODE and sequence.pending_token is not None:
                token = sequence.pending_token
                index = plan.add(token, sequence.n_past, sequence.seq_id, True)
                sequence.kv_tokens.append(token)
                sequence.n_past += 1
                sequence.pending_token = None
                plan.samples.append((sequence, index))
        room = self.batch_size - len(plan.tokens)
        for sequence in self.running:
            if room <= 0:
                break
            if sequence.phase is not Phase.PREFILL or sequence.leader is not None:
                continue
            chunk = sequence.prompt[sequence.n_past : min(sequence.n_past + room, len(sequence.prompt) - 1)]
            for offset, token in enumerate(chunk):
                plan.add(token, sequence.n_past + offset, sequence.seq_id, False)
            sequence.kv_tokens.extend(chunk)
            sequence.n_past += len(chunk)
            plan.prefilled_tokens += len(chunk)
            room -= len(chunk)
        return plan

    def on_sampled(self, sequence: Sequence, token: int) -> None:
        """The engine sampled `token` for `sequence`; it is decoded in the next step."""
        sequence.generated += 1
        sequence.pending_token = token

    # ---- admission and the prefix cache ---------------------------------------------------

    def _admit(self) -> list[Sequence]:
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.parallel:
            head = self.waiting[0]
            match = self._best_prefix(head.prompt)
            if not self._make_room(head.reserved, protect=match):
                if match is None or not self._make_room(head.reserved, protect=None):
                    break  # FIFO: the head waits for running sequences to finish; nothing overtakes it
                match = self._best_prefix(head.prompt)
            self.waiting.popleft()
            head.seq_id = self._free_seq_ids.pop(0)
            head.phase = Phase.PREFILL
            lead = self._best_running_prefix(head.prompt)
            if lead is not None and (match is None or lead[1] > match[1]):
                head.leader, head.shared = lead
                if head.leader.n_past >= head.shared:
                    self._copy_from_leader(head)
            elif match is not None:
                entry, length = match
                self._pending_ops.append(KvCopy(entry.seq_id, head.seq_id, length))
                self.cache.move_to_end(entry.seq_id)
                head.kv_tokens = list(entry.tokens[:length])
                head.n_past = head.cached_tokens = length
            self.running.append(head)
            admitted.append(head)
        return admitted

    def _best_prefix(self, prompt: list[int]) -> tuple[CacheEntry, int] | None:
        best: tuple[CacheEntry, int] | None = None
        for entry in self.cache.values():
            # At least the last prompt token is decoded again: its logits give the first sample.
            length = min(common_prefix_length(entry.tokens, prompt), len(prompt) - 1)
            if length > 0 and (best is None or length > best[1]):
                best = (entry, length)
        return best

    def _best_running_prefix(self, prompt: list[int]) -> tuple[Sequence, int] | None:
        best: tuple[Sequence, int] | None = None
        for sequence in self.running:
            length = min(common_prefix_length(sequence.known_tokens(), prompt), len(prompt) - 1)
            if length >= MIN_SHARED_PREFIX and (best is None or length > best[1]):
                best = (sequence, length)
        return best

    def _copy_from_leader(self, follower: Sequence) -> None:
        leader, length = follower.leader, follower.shared
        assert leader is not None
        self._pending_ops.append(KvCopy(leader.seq_id, follower.seq_id, length))
        follower.kv_tokens = list(follower.prompt[:length])
        follower.n_past = follower.cached_tokens = length
        follower.leader = None

    def _release_followers(self, leader: Sequence) -> None:
        """A leader leaves: followers take what it has computed, or prefill by themselves."""
        for sequence in self.running:
            if sequence.leader is leader:
                if leader.n_past >= sequence.shared:
                    self._copy_from_leader(sequence)
                else:
                    sequence.leader = None

    def _make_room(self, cells: int, protect: tuple[CacheEntry, int] | None) -> bool:
        """Evicts least-recently-used cache entries until `cells` and a sequence id are free."""
        protected = protect[0].seq_id if protect else None
        floor = sum(s.reserved for s in self.running) + (len(protect[0].tokens) if protect else 0)
        if floor + cells > self.n_ctx:
            return False  # only running sequences finishing can make room: evicting the cache would not help
        while self.reserved_cells + cells > self.n_ctx or not self._free_seq_ids:
            victim = next((seq_id for seq_id in self.cache if seq_id != protected), None)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _insert_cache_entry(self, entry: CacheEntry) -> None:
        for seq_id, other in list(self.cache.items()):
            if other.tokens == entry.tokens[: len(other.tokens)]:
                self._evict(seq_id)  # the new entry holds everything the old one did
            elif entry.tokens == other.tokens[: len(entry.tokens)]:
                self._release_seq_id(entry.seq_id)  # an existing entry already covers this one
                self.cache.move_to_end(seq_id)
                return
        self.cache[entry.seq_id] = entry
        while len(self.cache) > self.cache_slots:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        self._evict(next(iter(self.cache)))

    def _evict(self, seq_id: int) -> None:
        del self.cache[seq_id]
        self._release_seq_id(seq_id)

    def _release_seq_id(self, seq_id: int) -> None:
        if seq_id < 0:
            return
        self._pending_ops.append(KvRemove(seq_id))
        self._free_seq_ids.append(seq_id)

    def take_pending_ops(self) -> list[KvOp]:
        """KV removals due now (the engine applies them even when no step follows)."""
        ops, self._pending_ops = self._pending_ops, []
        return ops

    def sequence_count(self) -> int:
        return len(self.running) + len(self.waiting)


