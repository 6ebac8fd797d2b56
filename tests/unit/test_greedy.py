"""GreedyPicker picks what llama.cpp's logit_bias + greedy chain picks: the first highest biased logit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.engine.greedy import GreedyPicker


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
def test_matches_the_reference_with_any_biases(values: list[float], data: st.DataObject) -> None:
    logits = np.array(values, dtype=np.float32)
    tokens = data.draw(st.lists(st.integers(0, len(values) - 1), unique=True, max_size=len(values)))
    biases = data.draw(st.lists(st.sampled_from([float("-inf"), -1.0, 0.5, 1.0, 2.5]), min_size=len(tokens),
                                max_size=len(tokens)))
    bias = tuple(zip(tokens, biases))
    assert GreedyPicker(bias).pick(logits) == reference(logits, bias)
