"""The scheduler's KV bookkeeping: the cells each sequence id holds (`KvLedger`), the ids that are free, and the KV
ops queued for llama.cpp until the next step hands them out. Pure, no llama.cpp."""

from __future__ import annotations

import bisect

from edge_llm.engine.scheduling.kv_ledger import KvLedger
from edge_llm.engine.scheduling.sequence import Sequence
from edge_llm.engine.scheduling.step_plan import KvCopy, KvOp, KvRemove


class KvBook:
    def __init__(self, *, n_ctx: int, n_seq_max: int, stream_cells: int | None) -> None:
        self.n_ctx = n_ctx
        # With a KV stream per sequence (--deterministic) a sequence holds at most `stream_cells` cells, and a copied
        # prefix is the destination's own cells (a copy of the data, not shared cells): the ledger charges it so.
        self.stream_cells = stream_cells
        self.ledger = KvLedger()
        # Sorted; the lowest is taken next: with a KV stream per sequence llama.cpp batches only consecutive ids
        # together, so running sequences are best kept on low, adjacent ids.
        self.free_ids: list[int] = list(range(n_seq_max))
        self.pending: list[KvOp] = []
        # Ops that must wait until this step's batch is decoded (a moved chunk joins its sequence after the tokens
        # before it): they go first in the next step's.
        self.after_decode: list[KvOp] = []

    @property
    def sequence_context(self) -> int:
        """The most cells one sequence may fill."""
        return self.n_ctx if self.stream_cells is None else self.stream_cells

    @property
    def used(self) -> int:
        """Distinct KV cells held by anyone, after the queued KV ops."""
        return self.ledger.used

    @property
    def free_cells(self) -> int:
        return self.n_ctx - self.ledger.used

    def take_id(self) -> int:
        return self.free_ids.pop(0)

    def release(self, seq_id: int, *, queue_removal: bool = True) -> None:
        """`seq_id` holds nothing any more (its cells are removed unless the caller queued that already)."""
        if seq_id < 0:
            return
        if queue_removal:
            self.pending.append(KvRemove(seq_id))
        self.ledger.drop(seq_id)
        bisect.insort(self.free_ids, seq_id)

    def share_prefix(self, src_seq: int, dst: Sequence, length: int) -> None:
        """`dst` (just given its id) starts with `src_seq`'s first `length` positions, which it then need not compute."""
        self.pending.append(KvCopy(src_seq, dst.seq_id, length))
        if self.stream_cells is None:
            self.ledger.copy(src_seq, dst.seq_id, length)
        else:
            self.ledger.grow(dst.seq_id, length)
        dst.kv_tokens = list(dst.feed[:length])
        dst.n_past = length
        if dst.preemptions == 0:
            dst.cached_tokens = min(length, len(dst.prompt))

    def take_all_ops(self) -> list[KvOp]:
        """Every queued op, those waiting for the last decode first: for a step, or between a decode and the next."""
        ops, self.after_decode, self.pending = self.after_decode + self.pending, [], []
        return ops

    def take_pending_ops(self) -> list[KvOp]:
        """The ops queued since a step's were handed out, except those that must follow its decode."""
        ops, self.pending = self.pending, []
        return ops
