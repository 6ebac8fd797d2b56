"""Integer bounds in JSON schemas as GBNF (engine/grammar/integer_range.py): each rule matches exactly the integers in its
range, written as JSON writes them, checked against every number around the bounds."""

from __future__ import annotations

import random
import re

import pytest

from edge_llm.engine.grammar.integer_range import integer_range_rule


def as_regex(rule: str) -> re.Pattern[str]:
    """The rule's GBNF (literals, classes, {m}/{m,n} repetition, groups, alternatives) as a Python regex."""
    pattern = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), rule.replace(" ", ""))
    return re.compile(f"^(?:{pattern})$")


RNG = random.Random(7)
CASES = [(0, 9), (0, None), (None, 9), (-5, 5), (5, 12), (1, 100), (-100, -3), (None, None), (10, 10), (0, 0),
         (-1, -1), (7, 999), (123, 4567), (None, -10), (3, None), (-20, None), (100, 199), (90, 1000)]
CASES += [(RNG.randint(-3000, 3000), None) for _ in range(8)]
CASES += [tuple(sorted((RNG.randint(-3000, 3000), RNG.randint(-3000, 3000)))) for _ in range(24)]


@pytest.mark.parametrize(("low", "high"), CASES)
def test_a_range_rule_matches_exactly_the_integers_in_it(low: int | None, high: int | None) -> None:
    regex = as_regex(integer_range_rule(low, high))
    wrong = [n for n in range(-12000, 12000)
             if bool(regex.match(str(n))) != ((low is None or n >= low) and (high is None or n <= high))]
    assert not wrong, wrong[:5]
    for text in ("007", "-0", "00", "-012", "01", "+5", "", "-"):
        assert not regex.match(text), text


def test_an_empty_range_has_no_rule() -> None:
    assert integer_range_rule(5, 4) == ""
