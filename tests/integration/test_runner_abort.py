"""Stopping a decode part-way on the real llama.cpp (engine/llama/runner.py): `abort_step` makes `decode` raise
StepAbortedError and llama.cpp keep none of the batch's cells; after `arm_abort` the same batch decodes in full, and
logits follow as if the stopped decode had never happened."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from edge_llm.engine.llama.runner import ContextConfig, LlamaRunner
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.types import StepAbortedError, TokenLogprob
from edge_llm.testing.server import MODEL, THREADS

PROMPT = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaRunner]:
    runner = LlamaRunner(MODEL, ContextConfig(n_ctx=512, n_batch=256, n_seq_max=2, n_threads=THREADS, n_threads_batch=THREADS))
    yield runner
    runner.close()


def prompt_plan(tokens: list[int], seq_id: int) -> StepPlan:
    plan = StepPlan()
    for position, token in enumerate(tokens):
        plan.add(token, position, seq_id, position == len(tokens) - 1)
    return plan


def last_distribution(runner: LlamaRunner, plan: StepPlan) -> TokenLogprob:
    """The last prompt token's next-token distribution, as the API reports it: the 50 likeliest tokens' exact
    log-probabilities (log-softmax over every logit, so the whole row takes part)."""
    return runner.logprobs(len(plan.tokens) - 1, 0, 50)


def test_a_stopped_decode_keeps_no_cells_and_the_next_one_runs_in_full(runner: LlamaRunner) -> None:
    tokens = runner.tokenize(PROMPT, add_special=False, parse_special=True)
    runner.arm_abort()
    runner.decode(prompt_plan(tokens, 0))
    reference = last_distribution(runner, prompt_plan(tokens, 0))
    runner.clear_kv()

    runner.abort_step()  # set before the decode starts: it stops at its first graph node
    with pytest.raises(StepAbortedError):
        runner.decode(prompt_plan(tokens, 1))
    # llama.cpp took the stopped batch's positions back: the same positions decode again, from the first
    runner.arm_abort()
    again = prompt_plan(tokens, 1)
    runner.decode(again)
    assert last_distribution(runner, again) == reference
    runner.clear_kv()
