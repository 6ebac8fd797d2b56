"""What the scheduler asks of the KV cache before a step's batch is decoded (the runner applies them in order)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KvCopy:
    src_seq: int
    dst_seq: int
    length: int  # positions [0, length)


@dataclass(frozen=True)
class KvRemove:
    seq_id: int


# With --cache-reuse a chunk of a cached sequence is moved to other positions (engine/scheduler.py, "moved
# chunks"). llama.cpp re-rotates the moved keys (RoPE) at the next decode; their values still reflect the text
# that preceded them before, an approximation only requests that ask for it get.


@dataclass(frozen=True)
class KvCopyRange:
    """`dst_seq` also holds `src_seq`'s cells at positions [start, end) (shared, as KvCopy)."""

    src_seq: int
    dst_seq: int
    start: int
    end: int


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


KvOp = KvCopy | KvRemove | KvCopyRange | KvTrim | KvShift
