"""Test helpers for the scheduler: a driver that acts like the engine and a model of the KV cache.

The KV model applies every op and every batch the scheduler hands out, and checks that they are
coherent: a decode position is always the next free position of its sequence, a copy only
copies positions its source really holds into an empty sequence, and a sequence's tokens are
the ones the scheduler believes (`kv_tokens`, cache entries). Like llama.cpp's unified cache, a copy
shares cells (the same cell objects) and a cell is free when nobody holds it, so the model counts the
cells really in use, which must equal the scheduler's ledger and never exceed the context; with a KV stream per
sequence (`stream_cells`, --deterministic) a copy makes new cells and no sequence outgrows its stream. The driver
also checks the layout of every batch (`Driver.check_plan`): decode tokens first, then prompt chunks, the one that
reaches the end of what a sequence must have before its next sample (`feed`) with logits on that last row.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from edge_llm.engine.scheduling.step_plan import KvShift, KvTrim
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase, Sequence
from edge_llm.engine.scheduling.step_plan import KvCopy, KvOp, KvRemove, StepPlan


class _Cell:
    __slots__ = ("token",)

    def __init__(self, token: int) -> None:
        self.token = token


class KvModel:
    def __init__(self, n_seq_max: int, stream_cells: int | None = None) -> None:
        self.n_seq_max = n_seq_max
        # With a KV stream per sequence (--deterministic), a copy between sequences copies the data (new cells) and
        # no sequence holds more than `stream_cells` positions.
        self.stream_cells = stream_cells
        self.cells: dict[int, dict[int, _Cell]] = {}  # seq id → position → its cell (shared after a copy)
        self.log: list[KvOp] = []

    @property
    def seqs(self) -> dict[int, list[int]]:
        """Each sequence's tokens in position order."""
        return {seq_id: [cells[p].token for p in sorted(cells)] for seq_id, cells in self.cells.items()}

    def positions(self, seq_id: int) -> list[int]:
        return sorted(self.cells.get(seq_id, {}))

    @property
    def cells_in_use(self) -> int:
        return len({id(cell) for cells in self.cells.values() for cell in cells.values()})

    def apply_ops(self, ops: list[KvOp]) -> None:
        for op in ops:
            self.log.append(op)
            if isinstance(op, KvRemove):
                assert 0 <= op.seq_id < self.n_seq_max
                self.cells.pop(op.seq_id, None)
            elif isinstance(op, KvCopy) and op.start == 0:  # a prefix, into a sequence that holds nothing
                assert op.src_seq != op.dst_seq
                src = self.cells.get(op.src_seq, {})
                assert op.end > 0 and all(p in src for p in range(op.end)), \
                    f"copy of {op.end} positions from a sequence holding {sorted(src)}"
                assert not self.cells.get(op.dst_seq), "copy into a sequence that still holds cells"
                if self.stream_cells is None:
                    self.cells[op.dst_seq] = {p: src[p] for p in range(op.end)}
                else:
                    self.cells[op.dst_seq] = {p: _Cell(src[p].token) for p in range(op.end)}
            elif isinstance(op, KvCopy):  # a moved chunk's range
                assert self.stream_cells is None, "a range copy between KV streams (llama.cpp copies whole streams)"
                src = self.cells.get(op.src_seq, {})
                dst = self.cells.setdefault(op.dst_seq, {})
                taken = {p: cell for p, cell in src.items() if op.start <= p < op.end}
                assert taken, "a range copy of positions the source does not hold"
                assert not set(taken) & set(dst), "a range copy onto positions the destination holds"
                dst.update(taken)
            elif isinstance(op, KvTrim):
                cells = self.cells.get(op.seq_id, {})
                end = op.end if op.end >= 0 else float("inf")
                self.cells[op.seq_id] = {p: cell for p, cell in cells.items() if not op.start <= p < end}
            elif isinstance(op, KvShift):
                self._shift(op)
            else:  # pragma: no cover - the scheduler has only these ops
                raise AssertionError(op)

    def _shift(self, op: KvShift) -> None:
        """Like llama.cpp's seq_add: the positions of the sequence's cells in [start, end) move. A cell has one
        position, so moving one that another sequence holds would corrupt that one: never allowed."""
        cells = self.cells.get(op.seq_id, {})
        moving = {p: cell for p, cell in cells.items() if op.start <= p < op.end}
        assert moving, "a shift of positions the sequence does not hold"
        others = {id(cell) for seq_id, held in self.cells.items() if seq_id != op.seq_id for cell in held.values()}
        assert not any(id(cell) in others for cell in moving.values()), "a shift of cells another sequence holds"
        staying = {p: cell for p, cell in cells.items() if p not in moving}
        moved = {p + op.delta: cell for p, cell in moving.items()}
        assert not set(moved) & set(staying), "a shift onto positions the sequence holds"
        self.cells[op.seq_id] = staying | moved

    def decode(self, plan: StepPlan, batch_size: int) -> None:
        n = len(plan.tokens)
        assert len(plan.positions) == len(plan.seq_ids) == len(plan.logits) == n
        assert 0 < n <= batch_size
        sample_indices = {index for _, index in plan.samples}
        assert len(sample_indices) == len(plan.samples)
        draft_indices = {index for _, rows in plan.drafts for index in rows}
        assert not sample_indices & draft_indices
        assert [i for i in range(n) if plan.logits[i]] == sorted(sample_indices | draft_indices), \
            "logits only where sampled or drafted"
        for token, position, seq_id in zip(plan.tokens, plan.positions, plan.seq_ids):
            assert 0 <= seq_id < self.n_seq_max
            cells = self.cells.setdefault(seq_id, {})
            # llama.cpp's rule: a sequence's new positions follow its last one (Y = X + 1)
            assert position == (max(cells) + 1 if cells else 0), f"seq {seq_id}: position {position} after {sorted(cells)[-3:]}"
            assert all(p in cells for p in range(position)), f"seq {seq_id}: position {position} after a gap"
            assert self.stream_cells is None or position < self.stream_cells, f"seq {seq_id} overflows its stream"
            cells[position] = _Cell(token)


class Driver:
    """Drives a Scheduler as the engine does: step, decode, sample, finish at max_tokens."""

    def __init__(self, scheduler: Scheduler, sample: Callable[[Sequence], int] | None = None) -> None:
        self.s = scheduler
        self.kv = KvModel(scheduler.n_seq_max, scheduler.stream_cells)
        self.sample = sample or (lambda seq: 1000 + seq.generated)
        self.plans: list[StepPlan] = []
        self.finished: list[Sequence] = []
        self.output: dict[str, list[int]] = {}

    def step(self, *, finish_at_max: bool = True) -> StepPlan:
        """One engine iteration: step, decode, sample every sequence; finish at max_tokens (unless told not to)."""
        plan = self._decode_next()
        for sequence, _ in plan.samples:
            self._sample(sequence, finish_at_max)
        return plan

    def step_with_ends(self, end_mask: int, *, out_of_cells: bool = False) -> list[Sequence]:
        """One engine iteration where the i-th sample (mod 8) is an end token when bit i of `end_mask` is set
        (a sequence then finishes without on_sampled); the others finish at max_tokens. Returns who finished.
        A step with running sequences always computes something."""
        plan = self._decode_next(out_of_cells=out_of_cells)
        if plan.empty and self.s.running:
            raise AssertionError("a step with running sequences made no progress")
        ended: list[Sequence] = []
        for i, (sequence, _) in enumerate(plan.samples):
            if end_mask >> (i % 8) & 1:
                self.check_sample_point(sequence)
                if sequence.speculation is not None and sequence.speculation.in_flight:
                    self.s.settle_draft(sequence, 0)  # the first token drawn ends the answer: the draft goes
                self.finish(sequence)
            elif not self._sample(sequence, True):
                continue
            ended.append(sequence)
        return ended

    def _decode_next(self, *, out_of_cells: bool = False) -> StepPlan:
        plan = self.s.step()
        self.plans.append(plan)
        self.check_plan(plan)
        self.kv.apply_ops(plan.kv_ops)
        if out_of_cells and not plan.empty:  # the engine's retry when llama_decode finds no cells (worker._decode)
            self.s.clear_cache()
            self.kv.apply_ops(self.s.take_pending_ops())
        if not plan.empty:
            self.kv.decode(plan, self.s.batch_size)
        assert len(plan.tokens) <= self.s.batch_size
        return plan

    def _sample(self, sequence: Sequence, finish_at_max: bool) -> bool:
        """Samples `sequence`'s next token, and with a draft in flight the next ones while they confirm it (as
        engine/speculative/acceptance.py does), settles the draft, then passes them on; True when it finished (max_tokens)."""
        self.check_sample_point(sequence)
        draft = sequence.speculation.in_flight if sequence.speculation is not None else ()
        tokens: list[int] = []
        for position in range(len(draft) + 1):
            shadow = copy.copy(sequence)  # what the sampler sees after the tokens drawn before this one
            shadow.output = sequence.output + tokens
            tokens.append(self.sample(shadow))
            if position == len(draft) or tokens[-1] != draft[position]:
                break
        if draft:
            self.s.settle_draft(sequence, len(tokens) - 1)
            self.check_kv(sequence)
        for token in tokens:
            self.s.on_sampled(sequence, token)
            self.output.setdefault(sequence.request_id, []).append(token)
            if finish_at_max and sequence.generated >= sequence.max_tokens:
                self.finish(sequence)
                return True
        return False

    def check_plan(self, plan: StepPlan) -> None:
        """The layout of a batch, checked right after `Scheduler.step` (before anything finishes).

        The decode part comes first: one token per sequence with logits, at its newest position, which is a
        generated token's or the feed's last one (when the KV already held the rest of the feed), and the drafts
        right after. Then prompt chunks, without logits except on the feed's last token when a chunk reaches it:
        that row is the sequence's sample, taken in this step, and the sequence decodes from then on.
        """
        owners = {q.seq_id: q for q in self.s.running}
        n_drafted = sum(len(rows) for _, rows in plan.drafts)
        decode_part = self.decode_part(plan)
        decoding = [(q, index) for q, index in plan.samples if index < decode_part]
        n_decode = len(decoding)
        assert [index for _, index in decoding] == list(range(n_decode)), "decode tokens first, one sample each"
        assert [i for _, rows in plan.drafts for i in rows] == list(range(n_decode, n_decode + n_drafted)), \
            "drafts right after the decode tokens"
        n_prefill = len(plan.tokens) - n_decode - n_drafted
        chunk_ends = plan.samples[n_decode:]
        assert decode_part == n_decode + n_drafted and all(index > decode_part for _, index in chunk_ends)
        ends = {index for _, index in chunk_ends}
        assert plan.logits == [True] * (n_decode + n_drafted) + [
            i in ends for i in range(n_decode + n_drafted, len(plan.tokens))], "logits only where sampled or drafted"
        assert len({q.seq_id for q, _ in plan.samples}) == len(plan.samples), "one sample per sequence"
        drafts = {id(q): rows for q, rows in plan.drafts}
        assert len(drafts) == len(plan.drafts)
        if n_drafted:
            assert n_prefill == 0, "no drafts in a step with prompt chunks"
        for sequence, index in decoding:
            rows = drafts.pop(id(sequence), [])
            draft = sequence.speculation.in_flight if rows else ()
            assert len(draft) == len(rows) and list(draft) == [plan.tokens[i] for i in rows]
            assert [plan.positions[i] for i in rows] == [plan.positions[index] + 1 + k for k in range(len(rows))]
            assert all(plan.seq_ids[i] == sequence.seq_id for i in rows)
            assert sequence.generated + len(draft) < sequence.max_tokens, "a draft beyond max_tokens"
            assert plan.seq_ids[index] == sequence.seq_id
            assert plan.positions[index] == sequence.n_past - 1 - len(draft) >= len(sequence.feed) - 1
            if plan.positions[index] == len(sequence.feed) - 1:
                assert plan.tokens[index] == sequence.feed[-1]
        assert not drafts, "a draft without its sequence's decode token"
        for sequence, index in chunk_ends:
            assert sequence.phase is Phase.DECODE and sequence.pending_token is None
            assert plan.seq_ids[index] == sequence.seq_id and plan.tokens[index] == sequence.feed[-1]
            assert plan.positions[index] == len(sequence.feed) - 1 == sequence.n_past - 1
            assert index + 1 == len(plan.tokens) or plan.seq_ids[index + 1] != sequence.seq_id, "the chunk's last row"
        for token, position, seq_id in list(zip(plan.tokens, plan.positions, plan.seq_ids))[n_decode + n_drafted:]:
            feed = owners[seq_id].feed
            assert position < len(feed), "a prefill chunk beyond the feed"
            assert token == feed[position]
        assert plan.prefilled_tokens == n_prefill

    @staticmethod
    def decode_part(plan: StepPlan) -> int:
        """The rows before the first prompt chunk: every row there is a sample or a draft (a chunk's first row
        never is: a chunk that ends a prompt has two rows at least, the decode part taking a lone last token)."""
        rows = {index for _, index in plan.samples} | {i for _, rows in plan.drafts for i in rows}
        return next((i for i in range(len(plan.tokens)) if i not in rows), len(plan.tokens))

    def finish(self, sequence: Sequence, *, keep_in_cache: bool = True) -> None:
        self.s.remove(sequence, keep_in_cache=keep_in_cache)
        self.finished.append(sequence)

    def flush_ops(self) -> list[KvOp]:
        ops = self.s.take_pending_ops()
        self.kv.apply_ops(ops)
        return ops

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if self.s.idle():
                return
            self.step()
        raise AssertionError("the scheduler did not finish its work")

    def kv_after_pending_ops(self) -> dict[int, list[int]]:
        """The KV cells as the next decode will find them: ops the scheduler has queued
        (removals, copies for followers) are applied before it."""
        return self.future_kv().seqs

    def future_kv(self) -> KvModel:
        future = KvModel(self.kv.n_seq_max, self.kv.stream_cells)
        future.cells = {seq_id: dict(cells) for seq_id, cells in self.kv.cells.items()}
        future.apply_ops(list(self.s.kv.after_decode) + list(self.s.kv.pending))
        return future

    def check_sample_point(self, sequence: Sequence) -> None:
        """Where a sequence is sampled, its KV holds its prompt and then every token it generated, each once
        (across preemptions too), and nothing else."""
        self.check_kv(sequence)
        draft = list(sequence.speculation.in_flight) if sequence.speculation is not None else []
        assert sequence.kv_tokens == sequence.prompt + sequence.output + draft, "a token is lost or doubled in the KV"

    def check_kv(self, sequence: Sequence) -> None:
        """Positions [0, n_past) hold kv_tokens; a moved chunk the prefill has not reached yet holds its tokens."""
        future = self.future_kv()
        assert future.positions(sequence.seq_id) == list(range(sequence.n_past))
        assert future.seqs.get(sequence.seq_id, []) == sequence.kv_tokens
        assert len(sequence.kv_tokens) == sequence.n_past
        moved = sequence.moved
        if moved is not None:  # the chunk waits in its holder, at its old positions, until the prefill reaches it
            assert moved.start > sequence.n_past, "a chunk the prefill has reached is not counted as computed"
            assert future.positions(moved.holder) == list(range(moved.old_start, moved.old_start + moved.length))
            assert future.seqs[moved.holder] == sequence.feed[moved.start:moved.start + moved.length]

    def check_cache(self) -> None:
        cells = self.kv_after_pending_ops()
        future = self.future_kv()
        for seq_id, entry in self.s.cache.items():
            assert entry.seq_id == seq_id
            assert cells.get(seq_id, []) == list(entry.tokens), "cache entry differs from the KV cells"
            assert future.positions(seq_id) == list(range(len(entry.tokens)))

    def check_coherent(self) -> None:
        """Every running sequence and cache entry holds exactly the cells the scheduler believes."""
        for q in self.s.running:
            self.check_kv(q)
        self.check_cache()

    def check_invariants(self) -> None:
        s = self.s
        assert s.kv_cells_used == self.future_kv().cells_in_use, "the ledger differs from the cells in use"
        assert s.kv_cells_used <= s.n_ctx
        assert len(s.running) <= s.parallel
        assert len(s.cache) <= s.cache_slots
        used = [q.seq_id for q in s.running] + list(s.cache) + [q.moved.holder for q in s.running if q.moved]
        assert len(set(used)) == len(used), "a seq id is held twice"
        assert all(0 <= i < s.n_seq_max for i in used)
        free = list(s.kv.free_ids)
        assert len(set(free)) == len(free), "a seq id is free twice"
        assert sorted(free + used) == list(range(s.n_seq_max)), "a seq id was lost or duplicated"
        for q in s.waiting:
            assert q.phase is Phase.WAITING and q.seq_id == -1
        for q in s.running:
            assert q.phase in (Phase.PREFILL, Phase.DECODE)
            # the prompt's last token is decoded in the same step the sequence turns to DECODE
            if q.phase is Phase.PREFILL:
                assert q.n_past < len(q.feed) and q.pending_token is None
            else:
                assert q.n_past >= len(q.feed) and q.leader is None
            assert len(q.kv_tokens) == q.n_past
            assert q.kv_tokens[: min(q.n_past, len(q.feed))] == q.feed[: q.n_past]
            assert q.feed == q.prompt + q.output[: len(q.feed) - len(q.prompt)]
        # the KV model holds cells only for sequences that exist (after pending removals)
        pending_removed = {op.seq_id for op in s.kv.after_decode + s.kv.pending if isinstance(op, KvRemove)}
        for seq_id, cells in self.kv.seqs.items():
            if cells and seq_id not in pending_removed:
                assert seq_id in used, f"seq {seq_id} holds cells but belongs to nobody"
