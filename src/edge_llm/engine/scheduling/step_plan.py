"""What one scheduler step hands the engine: the KV ops to apply first (in order), then the batch to decode."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_llm.engine.scheduling.sequence import Sequence


@dataclass(frozen=True)
class KvCopy:
    """`dst_seq` also holds `src_seq`'s cells at positions [start, end): shared cells (seq_cp adds the id), not a
    copy of the data. A prefix is [0, end)."""

    src_seq: int
    dst_seq: int
    end: int
    start: int = 0


@dataclass(frozen=True)
class KvRemove:
    seq_id: int


# With --cache-reuse a chunk of a cached sequence is moved to other positions (engine/scheduling/scheduler.py, "moved
# chunks"). llama.cpp re-rotates the moved keys (RoPE) at the next decode; their values still reflect the text
# that preceded them before, an approximation only requests that ask for it get.


@dataclass(frozen=True)
class KvTrim:
    """`seq_id` lets go of its cells at positions [start, end); end -1: to its last."""

    seq_id: int
    start: int
    end: int = -1


@dataclass(frozen=True)
class KvShift:
    """`seq_id`'s cells at positions [start, end) move by `delta` (they must be its alone: a cell has one position)."""

    seq_id: int
    start: int
    end: int
    delta: int


KvOp = KvCopy | KvRemove | KvTrim | KvShift


@dataclass
class StepPlan:
    kv_ops: list[KvOp] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[int] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)
    samples: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, batch index)
    # A sequence's draft (speculation.in_flight): the batch indices of its tokens, after the decode tokens
    drafts: list[tuple[Sequence, list[int]]] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    prefilled_tokens: int = 0
    # Its decode may be stopped part-way and the step taken back (Scheduler.undo_step): not when the prefill reached a
    # moved chunk, whose move follows the decode.
    undoable: bool = True

    @property
    def empty(self) -> bool:
        return not self.tokens

    def add(self, token: int, position: int, seq_id: int, want_logits: bool) -> int:
        self.tokens.append(token)
        self.positions.append(position)
        self.seq_ids.append(seq_id)
        self.logits.append(want_logits)
        return len(self.tokens) - 1
