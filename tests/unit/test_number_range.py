"""Number bounds in JSON schemas as GBNF (engine/grammar/number_range.py): each rule matches exactly the plain decimals in its
range, checked against many numbers around and between the bounds."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pytest

from edge_llm.engine.grammar.gbnf.syntax import parse_gbnf
from edge_llm.engine.grammar.number_range import number_range_rule

from .test_integer_range import as_regex

RNG = random.Random(11)
BOUNDS = ["0", "1", "-1", "0.5", "-0.5", "2.25", "-3.75", "10", "0.001", "99.9", "-100", "7.0625", "0.1", "1.5"]
CASES: list[tuple[str | None, bool, str | None, bool]] = []
for _ in range(60):
    low, high = sorted(RNG.sample(BOUNDS, 2), key=Decimal)
    CASES.append((low, RNG.random() < 0.5, high, RNG.random() < 0.5))
CASES += [("0", True, None, True), (None, True, "1", True), ("0.5", False, None, True), (None, True, "-2.5", False),
          ("1.5", True, "1.5", True), ("0", True, "1", True), ("0", False, "1", False), ("-1", True, "1", True),
          ("2.25", True, "2.5", True), ("2.25", False, "2.2501", True), (None, True, None, True),
          ("1.8", True, "3", True), ("0", True, "2.1", True), ("-2.1", True, "5", False)]  # a fraction's only digit above/below


def samples() -> list[str]:
    """Plain decimals around and between the bounds, written as JSON writes them, and some that JSON does not allow."""
    texts = {b for b in BOUNDS}
    for bound in BOUNDS:
        value = Decimal(bound)
        for delta in ("0.0001", "0.001", "0.01", "0.1", "0.25", "0.5", "1", "2", "10"):
            texts |= {str(value + Decimal(delta)), str(value - Decimal(delta))}
        point = bound if "." in bound else bound + "."
        texts |= {bound + "0", point + "0", point + "01"}
    texts |= {f"{RNG.uniform(-120, 120):.{RNG.randint(0, 5)}f}" for _ in range(3000)}
    return sorted(text for text in texts if JSON_DECIMAL.fullmatch(text))


JSON_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


@pytest.mark.parametrize(("low", "low_inclusive", "high", "high_inclusive"), CASES)
def test_a_number_rule_matches_exactly_the_decimals_in_its_range(low: str | None, low_inclusive: bool,
                                                                  high: str | None, high_inclusive: bool) -> None:
    lo, hi = (Decimal(low) if low is not None else None), (Decimal(high) if high is not None else None)
    rule = number_range_rule(lo, hi, low_inclusive, high_inclusive)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not (low_inclusive and high_inclusive))):
        assert rule == ""
        return
    regex = as_regex(rule)

    def inside(text: str) -> bool:
        value = Decimal(text)
        return ((lo is None or value > lo or (low_inclusive and value == lo))
                and (hi is None or value < hi or (high_inclusive and value == hi)))

    wrong = [text for text in samples() if text not in ("-0", "-0.0") and not text.startswith("-0.0")
             and bool(regex.match(text)) != inside(text)]
    assert not wrong, wrong[:8]
    for text in ("01", "00.5", "1.", ".5", "+1", "", "-", "1e2", "--1", "1..2"):
        assert not regex.match(text), text


def test_negative_zero_is_not_written() -> None:
    regex = as_regex(number_range_rule(Decimal(-1), Decimal(1)))
    assert not regex.match("-0") and regex.match("0") and regex.match("-0.5") and regex.match("0.0")


@pytest.mark.parametrize(("low", "high"), [("2.1", "2.35"), ("2.15", "2.4"), ("0.1", "0.35"), ("2.05", "2.5")])
@pytest.mark.parametrize(("low_inclusive", "high_inclusive"), [(True, True), (False, False), (True, False)])
def test_a_range_within_one_whole_number_holds_every_decimal_between_its_bounds(
        low: str, high: str, low_inclusive: bool, high_inclusive: bool) -> None:
    lo, hi = Decimal(low), Decimal(high)
    regex = as_regex(number_range_rule(lo, hi, low_inclusive, high_inclusive))
    whole = int(lo)
    texts = [f"{whole}.{n:0{digits}d}" for digits in (1, 2, 3) for n in range(10**digits)] + [str(whole)]
    wrong = [text for text in texts if bool(regex.match(text)) != (
        (lo < Decimal(text) or (low_inclusive and lo == Decimal(text)))
        and (Decimal(text) < hi or (high_inclusive and hi == Decimal(text))))]
    assert not wrong, wrong[:8]


def test_bounds_are_inclusive_unless_said_otherwise() -> None:
    regex = as_regex(number_range_rule(Decimal("0.5"), Decimal("1.5")))
    assert regex.match("0.5") and regex.match("1.5") and not regex.match("1.51")


@pytest.mark.parametrize(("low", "low_inclusive", "high", "high_inclusive"), [
    ("5", True, "4", True), ("1.5", True, "1.5", False), ("1.5", False, "1.5", True), ("2.5", True, "0.5", True)])
def test_an_empty_range_has_no_rule(low: str, low_inclusive: bool, high: str, high_inclusive: bool) -> None:
    assert number_range_rule(Decimal(low), Decimal(high), low_inclusive, high_inclusive) == ""


def test_a_range_ending_at_zero_holds_zero_and_never_minus_zero() -> None:
    regex = as_regex(number_range_rule(Decimal(-1), Decimal(0)))
    assert regex.match("0") and regex.match("0.0") and regex.match("-0.5") and regex.match("-1")
    assert not regex.match("-0") and not regex.match("0.5")


@pytest.mark.parametrize(("low", "low_inclusive", "high", "high_inclusive"), CASES)
def test_every_number_rule_is_a_grammar_llama_cpp_reads(low: str | None, low_inclusive: bool, high: str | None,
                                                         high_inclusive: bool) -> None:
    rule = number_range_rule(Decimal(low) if low is not None else None, Decimal(high) if high is not None else None,
                             low_inclusive, high_inclusive)
    if rule:
        parse_gbnf(f"root ::= {rule}\n")  # every alternative is made of literals and classes only: no rule names


@pytest.mark.parametrize(("low", "inside", "outside"), [
    (Decimal("2.0"), ["2", "2.0", "2.5"], ["1.99"]),  # JSON's 2.0: the fraction's digits are none, not "0"
    (Decimal("1E-7"), ["0.0000001", "0.5"], ["0.00000001", "0"]),  # 1e-07: read as plain decimal digits
])
def test_a_bound_written_with_trailing_zeros_or_an_exponent_means_its_value(low: Decimal, inside: list[str],
                                                                           outside: list[str]) -> None:
    regex = as_regex(number_range_rule(low, Decimal(3)))
    assert all(regex.match(text) for text in inside) and not any(regex.match(text) for text in outside)
