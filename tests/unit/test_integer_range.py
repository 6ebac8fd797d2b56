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


@pytest.mark.parametrize(("low", "high"), [(-5, 0), (None, 0), (-120, 0), (1, 500), (5, 12000), (-3000, -5)])
def test_no_number_is_written_with_a_leading_zero_or_as_minus_zero(low: int | None, high: int | None) -> None:
    regex = as_regex(integer_range_rule(low, high))
    inside = [n for n in range(-12000, 12001) if (low is None or n >= low) and (high is None or n <= high)]
    padded = [("-0" if n < 0 else "0") + str(abs(n)) for n in inside]
    assert not [text for text in padded + ["-0"] if regex.match(text)]


MAX_DIGITS = 16
BIG_CASES = [(0, 10**MAX_DIGITS - 1), (10**14 + 7, 10**15 + 3), (-(10**15), 10**15), (10**15 + 5, None),
             (None, -(10**15) - 5), (0, None), (None, None), (-(10**15), None)]


@pytest.mark.parametrize(("low", "high"), BIG_CASES)
def test_numbers_of_up_to_sixteen_digits_are_in_their_range_and_no_longer_one_is(low: int | None,
                                                                                high: int | None) -> None:
    """JSON's integers as the converter writes them: at most 16 digits where a side is unbounded; a bounded range
    holds all of its numbers, however long."""
    regex = as_regex(integer_range_rule(low, high))
    probes = {0, 1, -1, 10**MAX_DIGITS - 1, -(10**MAX_DIGITS - 1), 10**MAX_DIGITS, -(10**MAX_DIGITS),
              10 ** (MAX_DIGITS + 1) + 3, 10**15, 10**15 - 1, -(10**15)}
    for bound in (low, high):
        if bound is not None:
            probes |= {bound + delta for delta in range(-3, 4)}
    probes |= {n * 10**MAX_DIGITS // 997 for n in range(-997, 998, 13)}
    for n in sorted(probes):
        inside = (low is None or n >= low) and (high is None or n <= high) and len(str(abs(n))) <= MAX_DIGITS
        assert bool(regex.match(str(n))) == inside, n
