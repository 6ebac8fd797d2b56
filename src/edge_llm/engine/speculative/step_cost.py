"""What a decode step costs, by its rows and the KV cells they attend: the model speculative decoding weighs draft
rows with (engine/speculative/speculation.py). Pure, no llama.cpp.

A step's time is not linear in its rows on a CPU. ggml-cpu multiplies the repacked K-quant weights by activations
in groups of 4 rows (a tiled kernel) and by the rows left over one at a time, so the first row of each further group
of 4 costs most of a token and the next three little: measured in process on the default model with 2 threads
(`benchmarks/run_benchmarks.py --only step-cost`, results/step_cost.md), a step of 4 rows takes 2.2 times a
1-row step, 5 rows 3.1 times, 8 rows 3.9 times. Attention adds a cost per row in proportion to the cells its sequence
holds (flash attention skips the cells the mask hides, but not for free: a smaller cost per row for every cell the
step's sequences hold). So beside one decoding sequence a draft of 3 tokens (4 rows) costs 1.2 tokens' time, a
draft of 1 costs 0.64 of it, and a 4th draft token costs nearly as much as the first three.

The figures are constants, not measured as the engine runs: the drafts, and so the batches, must follow from the
tokens alone, or a request that runs alone would not repeat its answer (docs/architecture.md, Repeatability). The
cells a row attends are taken from its own sequence, for the same reason (the cells other cached sequences hold
are not a request's own).
"""

from __future__ import annotations

from dataclasses import dataclass

GROUP = 4  # rows the tiled matrix kernel takes at once


@dataclass(frozen=True)
class StepCost:
    """A step's cost in units of a 1-row step at a short context."""

    first: tuple[float, ...]  # a step of 1 .. GROUP rows
    group: tuple[float, ...]  # what each further group's 1st .. GROUP-th row add to the step before the group
    decode_cell: float  # a decode row, for every 1,000 cells its sequence holds
    draft_cell: float  # a draft row, for every 1,000 cells its sequence holds
    step_cell: float  # every row, for every 1,000 cells the step's decoding sequences hold

    def rows(self, n: int) -> float:
        """A step of n rows at a short context."""
        if n <= 0:
            return 0.0
        if n <= GROUP:
            return self.first[n - 1]
        groups, left = divmod(n - GROUP - 1, GROUP)
        return self.first[-1] + groups * self.group[-1] + self.group[left]

    def __call__(self, decode_rows: int, decode_cells: int, draft_rows: int, draft_cells: int) -> float:
        """A step of `decode_rows` sequences' next tokens, their sequences holding `decode_cells` cells in all, and
        `draft_rows` draft rows attending `draft_cells` cells in all (a draft row attends its sequence's cells)."""
        rows = decode_rows + draft_rows
        return (self.rows(rows) + (self.decode_cell * decode_cells + self.draft_cell * draft_cells
                                   + self.step_cell * rows * decode_cells) / 1000)

    @classmethod
    def linear(cls, row_cost: float) -> StepCost:
        """A step of n rows costing (1 + row_cost n) / (1 + row_cost), attention free: for tests of the allocation."""
        unit = 1.0 + row_cost
        return cls(first=tuple((1.0 + row_cost * n) / unit for n in range(1, GROUP + 1)),
                   group=tuple(row_cost * n / unit for n in range(1, GROUP + 1)),
                   decode_cell=0.0, draft_cell=0.0, step_cell=0.0)


# Fitted by least squares over 1, 2 and 4 decoding sequences at 64 to 3,000 cells each, with 0 to 20 draft rows
# (results/step_cost.md); the groups past the first averaged and kept non-decreasing.
CPU_STEP_COST = StepCost(first=(1.0, 1.64, 2.01, 2.21), group=(0.93, 1.18, 1.38, 1.38),
                         decode_cell=0.114, draft_cell=0.125, step_cell=0.0203)
