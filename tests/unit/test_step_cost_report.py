"""The step-cost benchmark's fit and Markdown (benchmarks/suite/step_cost.py), on steps made from a known model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.suite import step_cost as sc
from edge_llm.engine.speculative.step_cost import CPU_STEP_COST, StepCost

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def steps_of(model: StepCost, unit_ms: float) -> dict[str, dict[str, float]]:
    return {f"{n}/{b}": {str(k): unit_ms * model(b, b * n, k, k * n) for k in sc.DRAFT_ROWS}
            for n in sc.CELLS for b in sc.BATCHES}


def test_the_fit_recovers_the_model_the_steps_came_from() -> None:
    fitted = sc.fit(steps_of(CPU_STEP_COST, 30.0))
    assert fitted["unit_ms"] == pytest.approx(30.0)
    assert fitted["rows"] == pytest.approx([CPU_STEP_COST.rows(n) for n in range(1, len(fitted["rows"]) + 1)])
    for term in sc.TERMS:
        assert fitted[term] == pytest.approx(getattr(CPU_STEP_COST, term), abs=1e-9)


def test_the_model_error_is_zero_on_its_own_steps_and_signed_when_drafts_cost_less() -> None:
    assert max(abs(e) for e in sc.model_errors(steps_of(CPU_STEP_COST, 30.0))) == pytest.approx(0.0, abs=1e-12)
    cheaper = StepCost(first=(1.0, 1.2, 1.4, 1.6), group=(0.2, 0.4, 0.6, 0.8), decode_cell=0.114, draft_cell=0.0,
                       step_cell=0.0)
    assert all(e > 0 for e in sc.model_errors(steps_of(cheaper, 30.0)))


def test_the_committed_results_render_as_committed() -> None:
    results = json.loads((RESULTS / "step_cost.json").read_text(encoding="utf-8"))
    assert (RESULTS / "step_cost.md").read_text(encoding="utf-8") == sc.step_cost_markdown(results)
    assert results["model"]["group"] == list(CPU_STEP_COST.group)
