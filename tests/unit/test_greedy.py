"""GreedyPicker picks what llama.cpp's logit_bias + greedy chain picks: the first highest biased logit.

The property tests compare it with a Python reference of that rule on small synthetic logits; the last test
compares the runner's greedy fast path with llama.cpp's own native chain on real logits of the default model.
"""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.engine.llama.greedy import GreedyPicker
from edge_llm.engine.llama.runner import ContextConfig, LlamaRunner
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.types import SamplingParams
from edge_llm.testing.server import MODEL


def reference(logits: np.ndarray, bias: tuple[tuple[int, float], ...]) -> int:
    adjusted = [float(v) for v in logits]
    for token, value in bias:
        adjusted[token] += value
    return max(range(len(adjusted)), key=lambda i: (adjusted[i], -i))


def test_plain_argmax_and_the_first_of_equal_maxima() -> None:
    assert GreedyPicker().pick(np.array([0.1, 3.0, -1.0, 3.0], dtype=np.float32)) == 1


def test_a_banned_top_token_gives_way_to_the_next() -> None:
    logits = np.array([0.5, 4.0, 2.0, 1.0], dtype=np.float32)
    picker = GreedyPicker(((1, float("-inf")),))
    assert picker.pick(logits) == 2
    assert logits[1] == 4.0  # the model's logits are left as they were


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-2.0, 0.0, 1.0, 1.5, 3.0]), min_size=4, max_size=40), st.data())
def test_the_likeliest_come_in_the_order_pick_prefers_them(values: list[float], data: st.DataObject) -> None:
    logits = np.array(values, dtype=np.float32)
    bias = tuple(data.draw(st.dictionaries(st.integers(0, len(values) - 1),
                                           st.sampled_from([float("-inf"), -1.0, 2.0]), max_size=3)).items())
    k = data.draw(st.integers(1, len(values)))
    ids, ranked = GreedyPicker(bias).likeliest(logits, k)
    adjusted = logits.copy()
    for token, value in bias:
        adjusted[token] += value
    expected = sorted(range(len(values)), key=lambda i: (-adjusted[i], i))
    assert list(ranked) == [adjusted[i] for i in expected[:k]]
    above = [int(t) for t, v in zip(ids, ranked) if v > ranked[-1]]  # which of the tokens tied with the last are
    assert above == expected[:len(above)]  # taken is arbitrary (the runner then checks the whole vocabulary)
    if ranked[0] > ranked[-1]:
        assert int(ids[0]) == reference(logits, bias)
    assert all(ranked[i] > ranked[i + 1] or ids[i] < ids[i + 1] for i in range(k - 1))  # ties: lowest id first


def test_a_positive_bias_can_make_a_token_win() -> None:
    logits = np.array([0.5, 4.0, 2.0, 1.0], dtype=np.float32)
    assert GreedyPicker(((3, 5.0),)).pick(logits) == 3
    assert GreedyPicker(((3, 2.0),)).pick(logits) == 1


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.sampled_from([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0]), min_size=2, max_size=12),
    data=st.data(),
)
def test_matches_a_python_reference_of_the_rule_with_any_biases(values: list[float], data: st.DataObject) -> None:
    logits = np.array(values, dtype=np.float32)
    tokens = data.draw(st.lists(st.integers(0, len(values) - 1), unique=True, max_size=len(values)))
    biases = data.draw(st.lists(st.sampled_from([float("-inf"), -1.0, 0.5, 1.0, 2.5]), min_size=len(tokens),
                                max_size=len(tokens)))
    bias = tuple(zip(tokens, biases))
    assert GreedyPicker(bias).pick(logits) == reference(logits, bias)


# ---- the runner's fast path against llama.cpp's native chain, on real logits -----------------------------------

PROMPT = ("<|im_start|>user\nWrite a Python function that checks whether a number is prime, and explain it "
          "in one sentence.<|im_end|>\n<|im_start|>assistant\ndef is_prime(n):\n    if n < 2:\n        return")


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaRunner]:
    """The default model, in this process, with the logits of every position of PROMPT from one batch."""
    runner = LlamaRunner(MODEL, ContextConfig(n_ctx=256, n_batch=256, n_seq_max=1, n_threads=2, n_threads_batch=2))
    try:
        prompt = runner.tokenize(PROMPT, add_special=False, parse_special=True)
        plan = StepPlan()
        for position, token in enumerate(prompt):
            plan.add(token, position, 0, True)
        runner.decode(plan)
        yield runner
    finally:
        runner.close()


def native_greedy(runner: LlamaRunner, index: int, bias: tuple[tuple[int, float], ...]) -> int:
    """What llama.cpp's own chain (logit_bias, then greedy) samples at batch position `index`."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        if bias:
            entries = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (token, value) in enumerate(bias):
                entries[i].token, entries[i].bias = token, value
            bias_sampler = llama_cpp.llama_sampler_init_logit_bias(runner.n_vocab, len(bias), entries)
            llama_cpp.llama_sampler_chain_add(chain, bias_sampler)
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return int(llama_cpp.llama_sampler_sample(chain, runner._ctx, index))  # noqa: SLF001 - the reference
    finally:
        llama_cpp.llama_sampler_free(chain)


def requests_for(row: np.ndarray) -> dict[str, SamplingParams]:
    """Greedy requests with the kinds of logit_bias they bring, aimed at this row's likeliest tokens."""
    top = [int(t) for t in np.argsort(row)[::-1][:4]]
    gap = float(row[top[0]] - row[top[1]])
    biases: dict[str, tuple[tuple[int, float], ...]] = {
        "no bias": (),
        "ban the top token": ((top[0], float("-inf")),),
        "ban the top three": tuple((t, float("-inf")) for t in top[:3]),
        "lift the second past the first": ((top[1], gap + 0.5),),
        "lift the second not quite": ((top[1], gap * 0.5),),
        "lower the top below the second": ((top[0], -(gap + 0.5)), (top[2], -1.0)),
        "tokens far from the top": ((5, 3.0), (1000, -100.0), (100000, float("-inf"))),
    }
    requests = {kind: SamplingParams(temperature=0.0, logit_bias=bias) for kind, bias in biases.items()}
    requests["ignore_eos"] = SamplingParams(temperature=0.0, ignore_eos=True)
    return requests


@pytest.mark.integration  # loads the default model (in this process: no server)
def test_the_greedy_fast_path_picks_what_the_native_greedy_chain_picks_on_real_logits(runner: LlamaRunner) -> None:
    end_tokens = tuple(t for t in range(runner.n_vocab) if runner.is_end_of_generation(t))
    positions = len(runner.tokenize(PROMPT, add_special=False, parse_special=True))
    compared = 0
    for index in range(positions):
        pointer = llama_cpp.llama_get_logits_ith(runner._ctx, index)  # noqa: SLF001 - the model's own row
        row = np.ctypeslib.as_array(pointer, shape=(runner.n_vocab,))
        before = row.copy()
        for kind, params in requests_for(row).items():
            sampler = runner.new_sampler(params)
            try:
                assert sampler.picker is not None and sampler.chain is None, kind  # the fast path, no chain
                bias = params.logit_bias + tuple((t, float("-inf")) for t in end_tokens) if params.ignore_eos \
                    else params.logit_bias
                assert runner.sample(sampler, index) == native_greedy(runner, index, bias), (index, kind)
            finally:
                sampler.close()
            compared += 1
        assert np.array_equal(row, before)  # neither the fast path nor the chain changed the model's logits
    assert positions > 20 and compared == 8 * positions
