"""GreedyPicker picks what llama.cpp's logit_bias + greedy chain picks: the first highest biased logit.

The property tests compare it with a Python reference of that rule on small synthetic logits; the last tests
compare it with llama.cpp's own native chain on real logits of the default model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.engine.greedy import GreedyPicker
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


# ---- against llama.cpp's native chain, on real logits -------------------------------------------------------

PROMPT = ("<|im_start|>user\nWrite a Python function that checks whether a number is prime, and explain it "
          "in one sentence.<|im_end|>\n<|im_start|>assistant\ndef is_prime(n):\n    if n < 2:\n        return")


@dataclass
class RealLogits:
    """The default model's logits for every position of PROMPT, decoded in one batch in this process."""

    context: Any
    vocab: Any
    rows: int
    end_tokens: tuple[int, ...]

    def row(self, index: int) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(self.context, index)
        return np.ctypeslib.as_array(pointer, shape=(llama_cpp.llama_vocab_n_tokens(self.vocab),))


@pytest.fixture(scope="module")
def real_logits() -> Iterator[RealLogits]:
    assert MODEL.is_file(), f"the default model is missing: {MODEL} (run `edge-llm model fetch`)"
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(MODEL).encode(), llama_cpp.llama_model_default_params())
    assert model, MODEL
    vocab = llama_cpp.llama_model_get_vocab(model)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 256
    params.n_threads = params.n_threads_batch = 2
    context = llama_cpp.llama_init_from_model(model, params)
    assert context
    text = PROMPT.encode()
    tokens = (llama_cpp.llama_token * 256)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 256, False, True)
    assert 20 < n < 256, n
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[i], i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = n
        assert llama_cpp.llama_decode(context, batch) == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        end_tokens = tuple(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        yield RealLogits(context, vocab, n, end_tokens)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)


def native_greedy(logits: RealLogits, index: int, bias: tuple[tuple[int, float], ...]) -> int:
    """What llama.cpp's own chain (logit_bias, then greedy) samples at batch position `index`."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        if bias:
            entries = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (token, value) in enumerate(bias):
                entries[i].token, entries[i].bias = token, value
            n_vocab = llama_cpp.llama_vocab_n_tokens(logits.vocab)
            bias_sampler = llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), entries)
            llama_cpp.llama_sampler_chain_add(chain, bias_sampler)
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return int(llama_cpp.llama_sampler_sample(chain, logits.context, index))
    finally:
        llama_cpp.llama_sampler_free(chain)


def biases_for(row: np.ndarray, end_tokens: tuple[int, ...]) -> dict[str, tuple[tuple[int, float], ...]]:
    """The kinds of logit_bias a greedy request brings, aimed at this row's likeliest tokens."""
    top = [int(t) for t in np.argsort(row)[::-1][:4]]
    gap = float(row[top[0]] - row[top[1]])
    return {
        "none": (),
        "ban the top token": ((top[0], float("-inf")),),
        "ban the top three": tuple((t, float("-inf")) for t in top[:3]),
        "lift the second past the first": ((top[1], gap + 0.5),),
        "lift the second not quite": ((top[1], gap * 0.5),),
        "lower the top below the second": ((top[0], -(gap + 0.5)), (top[2], -1.0)),
        "ban the end tokens (ignore_eos)": tuple((t, float("-inf")) for t in end_tokens),
        "tokens far from the top": ((5, 3.0), (1000, -100.0), (100000, float("-inf"))),
    }


@pytest.mark.integration  # loads the default model (in this process: no server)
def test_picks_what_the_native_greedy_chain_picks_on_real_logits(real_logits: RealLogits) -> None:
    compared = 0
    for index in range(real_logits.rows):
        row = real_logits.row(index)
        before = row.copy()
        for kind, bias in biases_for(row, real_logits.end_tokens).items():
            assert GreedyPicker(bias).pick(row) == native_greedy(real_logits, index, bias), (index, kind)
            compared += 1
        assert np.array_equal(row, before)  # neither the picker nor the chain changed the model's logits
    assert compared >= 8 * 20
