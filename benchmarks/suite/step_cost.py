"""`--only step-cost` (issue 17): what a decode step costs by its rows and the cells they attend, the measurement
engine/speculative/step_cost.py's CPU_STEP_COST comes from.

In this process, through the engine's runner with the server's context settings: b sequences (1, 2, 4) each holding
n cells (64 to 3,000) decode their next token plus k draft rows of the first sequence (0 to 20), every row with
logits; the median time of `repeats` steps each. Then a least-squares fit of

    time = W(b + k) + a * (cells the decoding rows' sequences hold) + d * (cells the draft rows attend)
           + s * (rows) * (cells the step's sequences hold)

with W free for every row count, in units of W(1); and how far CPU_STEP_COST (the fit rounded, its groups of rows
averaged) predicts each measured step relative to the step without drafts, which is what the allocation compares.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_llm.engine.speculative.step_cost import CPU_STEP_COST

from .plan import THREADS
from .report import fmt
from .speculative import SOURCE

logger = logging.getLogger(__name__)

BATCHES = (1, 2, 4)
CELLS = (64, 700, 1500, 3000)
DRAFT_ROWS = tuple(range(21))
REPEATS = 9
TERMS = ("decode_cell", "draft_cell", "step_cell")


def measure_steps(model: Path, repeats: int = REPEATS, cells: tuple[int, ...] = CELLS,
                  batches: tuple[int, ...] = BATCHES) -> dict[str, dict[str, float]]:
    """{"cells/b": {k: median ms}}."""
    from edge_llm.engine.llama.runner import ContextConfig, LlamaRunner
    from edge_llm.engine.scheduling.step_plan import KvTrim, StepPlan

    most = max(batches) * max(cells) + max(DRAFT_ROWS) + 64
    runner = LlamaRunner(model, ContextConfig(n_ctx=max(8192, most), n_batch=512, n_seq_max=16, n_threads=THREADS,
                                              n_threads_batch=THREADS, logit_rows=max(batches) + max(DRAFT_ROWS)))
    source = runner.tokenize(SOURCE, add_special=False, parse_special=False)
    steps: dict[str, dict[str, float]] = {}
    try:
        for n in cells:
            prompt = (source * (n // len(source) + 1))[:n]
            for b in batches:
                runner.clear_kv()
                for seq in range(b):
                    for start in range(0, n, 512):
                        chunk = StepPlan()
                        for position in range(start, min(start + 512, n)):
                            chunk.add(prompt[position], position, seq, False)
                        runner.decode(chunk)
                times: dict[int, list[float]] = {k: [] for k in DRAFT_ROWS}
                for _ in range(repeats):  # the row counts interleaved, so a slow spell spreads over all of them
                    for k in DRAFT_ROWS:
                        plan = StepPlan()
                        for seq in range(b):
                            plan.add(prompt[seq], n, seq, True)
                        for offset in range(k):
                            plan.add(prompt[offset], n + 1 + offset, 0, True)
                        started = time.perf_counter()
                        runner.decode(plan)
                        times[k].append(time.perf_counter() - started)
                        runner.apply_kv_ops([KvTrim(seq, n) for seq in range(b)])
                steps[f"{n}/{b}"] = {str(k): statistics.median(v) * 1000 for k, v in times.items()}
                logger.info("step cost: %d sequences of %d cells measured", b, n)
        runner.clear_kv()
    finally:
        runner.close()
    return steps


def scenarios(steps: dict[str, dict[str, float]]) -> list[tuple[int, int, int, float]]:
    """(cells, b, k, ms) of every measured step."""
    out = []
    for key, by_rows in steps.items():
        n, b = (int(part) for part in key.split("/"))
        out += [(n, b, int(k), ms) for k, ms in by_rows.items()]
    return out


def fit(steps: dict[str, dict[str, float]]) -> dict[str, Any]:
    measured = scenarios(steps)
    most_rows = max(b + k for _, b, k, _ in measured)
    columns, times = [], []
    for n, b, k, ms in measured:
        row = np.zeros(most_rows + len(TERMS))
        row[b + k - 1] = 1.0
        row[most_rows:] = (b * n / 1000, k * n / 1000, (b + k) * b * n / 1000)
        columns.append(row)
        times.append(ms)
    coefficients, *_ = np.linalg.lstsq(np.array(columns), np.array(times), rcond=None)
    unit = float(coefficients[0])
    return {"unit_ms": unit, "rows": [float(c) / unit for c in coefficients[:most_rows]],
            **{term: float(c) / unit for term, c in zip(TERMS, coefficients[most_rows:])}}


def model_errors(steps: dict[str, dict[str, float]]) -> list[float]:
    """For every step with drafts: CPU_STEP_COST's ratio to the same step without drafts, over the measured one,
    minus 1."""
    errors = []
    for n, b, k, ms in scenarios(steps):
        if k == 0:
            continue
        base = steps[f"{n}/{b}"]["0"]
        predicted = CPU_STEP_COST(b, b * n, k, k * n) / CPU_STEP_COST(b, b * n, 0, 0)
        errors.append(predicted / (ms / base) - 1.0)
    return errors


def run_step_cost(model: Path, quick: bool) -> dict[str, Any]:
    steps = measure_steps(model, repeats=3 if quick else REPEATS)
    errors = sorted(abs(e) for e in model_errors(steps))
    return {"step_ms": steps, "fit": fit(steps),
            "model": {"first": list(CPU_STEP_COST.first), "group": list(CPU_STEP_COST.group),
                      **{term: getattr(CPU_STEP_COST, term) for term in TERMS}},
            "model_error": {"median": statistics.median(errors), "p90": errors[int(0.9 * (len(errors) - 1))],
                            "max": errors[-1], "mean_signed": statistics.fmean(model_errors(steps))}}


def step_cost_markdown(results: dict[str, Any]) -> str:
    meta, steps, fitted, model = results["meta"], results["step_ms"], results["fit"], results["model"]
    lines = ["# What a decode step costs (issue 17)", "",
             f"{meta['date']}, {meta['model']}, {meta['threads']} threads, commit {meta['commit']}. In process, "
             "through the engine's runner: b sequences of n cells each decode a token, plus k draft rows of the "
             "first one (every row with logits); median ms of each step, and as a multiple of the step without "
             "drafts.", "",
             "| cells / b | k=0 ms | " + " | ".join(f"k={k}" for k in DRAFT_ROWS[1:]) + " |",
             "|---|---:|" + "---:|" * (len(DRAFT_ROWS) - 1)]
    for key, by_rows in steps.items():
        base = by_rows["0"]
        lines.append(f"| {key} | {fmt(base)} | "
                     + " | ".join(fmt(by_rows[str(k)] / base, digits=2) for k in DRAFT_ROWS[1:]) + " |")
    rows = fitted["rows"]
    lines += ["", f"Fit (units of a 1-row step at no context, {fmt(fitted['unit_ms'])} ms): W(N) for a step of N rows",
              "", "| N | " + " | ".join(str(n) for n in range(1, len(rows) + 1)) + " |",
              "|---|" + "---:|" * len(rows),
              "| fitted | " + " | ".join(fmt(w, digits=2) for w in rows) + " |",
              "| CPU_STEP_COST | " + " | ".join(fmt(CPU_STEP_COST.rows(n), digits=2)
                                                for n in range(1, len(rows) + 1)) + " |", "",
              "| per 1,000 cells | fitted | CPU_STEP_COST |", "|---|---:|---:|"]
    names = {"decode_cell": "a decode row, its sequence's cells", "draft_cell": "a draft row, its sequence's cells",
             "step_cell": "every row, the cells of the step's sequences"}
    for term, name in names.items():
        lines.append(f"| {name} | {fmt(fitted[term], digits=4)} | {fmt(model[term], digits=4)} |")
    error = results["model_error"]
    lines += ["", "CPU_STEP_COST against the measurement (a step with drafts relative to the same step without): "
              f"error median {fmt(error['median'] * 100)}%, p90 {fmt(error['p90'] * 100)}%, max "
              f"{fmt(error['max'] * 100)}%, mean signed {fmt(error['mean_signed'] * 100, digits=1)}% (positive: the "
              "model thinks drafts cost more than they do)."]
    return "\n".join(lines) + "\n"
