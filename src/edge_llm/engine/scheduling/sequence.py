"""A request as the scheduler sees it (`Sequence`, its `Phase`) and a finished one kept for prefix reuse."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_llm.engine.speculative.speculation import Speculation


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class MovedChunk:
    holder: int  # the spare seq id holding the chunk's cells meanwhile
    old_start: int  # its positions there
    start: int  # its positions in the new prompt
    length: int


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt: list[int]
    max_tokens: int
    group: Hashable = None  # the API request it answers (the choices of `n` share it): admission is fair between them
    phase: Phase = Phase.WAITING
    seq_id: int = -1
    n_past: int = 0  # positions of this sequence already in the KV cache
    cached_tokens: int = 0  # prompt positions reused from the prefix cache (at the first admission)
    moved_tokens: int = 0  # of those, positions whose KV was moved there from others (--cache-reuse)
    output: list[int] = field(default_factory=list)  # the tokens sampled so far
    pending_token: int | None = None  # sampled, not yet decoded
    # What the KV must hold before the next sample: the prompt, or after a preemption the prompt and
    # the output (the row of `feed`'s last token has logits and gives the next sample).
    feed: list[int] = field(default_factory=list)
    preemptions: int = 0
    generated_at_first_preemption: int = 0
    use_cache: bool = True  # False: shares no prefix with the cache or a leader, and leaves no cache entry
    kv_tokens: list[int] = field(default_factory=list)  # the tokens at positions 0..n_past-1
    # A follower shares its first `shared` prompt positions with a running `leader` still prefilling
    # them; it copies them (KvCopy) once the leader has, instead of computing them twice.
    leader: Sequence | None = None
    shared: int = 0
    # With --cache-reuse: a chunk of a cached prompt found again after an edit (token_match.moved_chunk) is moved
    # into place instead of computed (scheduler: moved chunks). It waits in a spare sequence until the prefill
    # reaches its new start: llama.cpp only appends a sequence's next positions.
    reuse_min: int = 0  # the shortest chunk worth moving; 0: none is
    moved: MovedChunk | None = None
    # With speculative decoding: its n-gram drafter, acceptance rates and the draft in flight.
    speculation: Speculation | None = None

    def pinned(self, max_preemptions: int) -> bool:
        """Preempted often enough: re-admitted with room for its whole answer, never preempted again."""
        return self.preemptions >= max_preemptions

    def known_tokens(self) -> list[int]:
        """The tokens this sequence's KV holds or will hold once its prompt is prefilled."""
        return self.feed if self.phase is Phase.PREFILL else self.kv_tokens

    @property
    def generated(self) -> int:
        return len(self.output)

    @property
    def reserved(self) -> int:
        """The most cells this sequence can ever hold."""
        return len(self.prompt) + self.max_tokens

    @property
    def growth_left(self) -> int:
        """Cells this sequence may still add to those it holds."""
        return self.reserved - self.n_past

    def will_decode(self) -> bool:
        """It takes a decode token (and a new cell) in the next step's decode part: a sampled token, or the feed's
        last one when the KV holds the rest of it."""
        if self.phase is Phase.DECODE:
            return self.pending_token is not None
        return self.phase is Phase.PREFILL and self.leader is None and self.n_past == len(self.feed) - 1


@dataclass(eq=False)
class CacheEntry:
    seq_id: int
    tokens: tuple[int, ...]
