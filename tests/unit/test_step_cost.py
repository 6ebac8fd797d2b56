"""The step cost model (engine/speculative/step_cost.py) as its documentation states it: the first GROUP rows cost
`first`, each further group's 1st..GROUP-th row add `group` to the step before that group, and attention adds per
1,000 cells: `decode_cell` per decode row's cells, `draft_cell` per draft row's, `step_cell` per row for the
step's decoding cells."""

from __future__ import annotations

import pytest

from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, GROUP, StepCost

COST = StepCost(first=(1.0, 1.5, 1.75, 2.0), group=(0.7, 0.9, 1.0, 1.2),
                decode_cell=0.1, draft_cell=0.3, step_cell=0.02)


def test_a_step_without_rows_costs_nothing() -> None:
    assert COST.rows(0) == 0.0
    assert COST.rows(-1) == 0.0


def test_the_first_group_costs_its_measured_figures() -> None:
    assert [COST.rows(n) for n in range(1, GROUP + 1)] == list(COST.first)


@pytest.mark.parametrize("groups_before", [1, 2, 3, 7])
def test_each_row_of_a_further_group_adds_to_the_full_groups_before_it(groups_before: int) -> None:
    full = COST.first[-1] + (groups_before - 1) * COST.group[-1]
    assert COST.rows(groups_before * GROUP) == pytest.approx(full)
    for row in range(1, GROUP + 1):
        assert COST.rows(groups_before * GROUP + row) == pytest.approx(full + COST.group[row - 1])


def test_attention_adds_its_cost_per_thousand_cells_of_each_kind() -> None:
    assert COST(1, 0, 0, 0) == COST.rows(1)
    assert COST(2, 3000, 0, 0) == pytest.approx(COST.rows(2) + 0.1 * 3 + 0.02 * 2 * 3)
    assert COST(1, 1000, 3, 2000) == pytest.approx(COST.rows(4) + 0.1 + 0.3 * 2 + 0.02 * 4 * 1)
    assert COST(0, 0, 2, 500) == pytest.approx(COST.rows(2) + 0.3 * 0.5)


def test_the_cpu_figures_make_a_fourth_draft_row_cost_most_of_a_token() -> None:
    """Beside one decoding sequence: a draft of 3 costs 1.2 tokens' time, a 4th draft token nearly as much again."""
    assert CPU_STEP_COST.rows(4) - CPU_STEP_COST.rows(1) == pytest.approx(1.21)
    assert CPU_STEP_COST.rows(5) - CPU_STEP_COST.rows(4) == pytest.approx(0.93)


def test_a_linear_cost_is_one_for_a_row_and_grows_by_the_row_cost() -> None:
    cost = StepCost.linear(0.5)
    assert [cost.rows(n) for n in range(1, 11)] == pytest.approx([(1 + 0.5 * n) / 1.5 for n in range(1, 11)])
    assert cost(3, 5000, 2, 7000) == pytest.approx(cost.rows(5))
