"""A step's draft rows (speculative decoding): the drafts worth verifying laid out in the step's batch, after its decode
tokens. Which drafts and how long is `speculation.allocate`'s choice; this module applies it to the plan and the
sequences. Pure, no llama.cpp."""

from __future__ import annotations

from edge_llm.engine.scheduling.sequence import Sequence
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.speculative.drafting import Draft
from edge_llm.engine.speculative.speculation import Speculation, allocate
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost


def lay_out_drafts(plan: StepPlan, room: int, cost: StepCost = CPU_STEP_COST) -> list[tuple[Sequence, int]]:
    """Adds the drafts worth verifying to `plan`, after its decode tokens (at most `room` rows and cells), each at
    the positions after its sequence's pending token; the caller charges the cells. Returns (sequence, rows)."""
    candidates: list[tuple[Speculation, Draft]] = []
    owners: list[Sequence] = []
    for sequence, _ in plan.samples:
        speculation = sequence.speculation
        if speculation is None:
            continue
        # The tokens emitted after this step (the accepted draft and one more) stay within max_tokens.
        limit = sequence.max_tokens - sequence.generated - 1
        draft = speculation.propose(sequence.kv_tokens, limit) if limit > 0 else None
        if draft is not None:
            candidates.append((speculation, draft))
            owners.append(sequence)
    if not candidates:
        return []
    added: list[tuple[Sequence, int]] = []
    decode_cells = sum(sequence.n_past for sequence, _ in plan.samples)
    lengths = allocate(candidates, len(plan.samples), room, cost, [sequence.n_past for sequence in owners],
                       decode_cells)
    for sequence, (speculation, draft), length in zip(owners, candidates, lengths):
        if not length:
            speculation.leave_out(draft, len(sequence.kv_tokens))
            continue
        speculation.shadow = None  # the draft's verification tells the same
        speculation.in_flight = draft.tokens[:length]
        speculation.in_flight_ngram = draft.ngram
        rows = [plan.add(token, sequence.n_past + offset, sequence.seq_id, True)
                for offset, token in enumerate(speculation.in_flight)]
        sequence.kv_tokens.extend(speculation.in_flight)
        sequence.n_past += length
        plan.drafts.append((sequence, rows))
        added.append((sequence, length))
    return added
