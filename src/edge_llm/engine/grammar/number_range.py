"""GBNF for the JSON numbers within a schema's bounds (`"type": "number"` with `minimum`, `maximum`,
`exclusiveMinimum`, `exclusiveMaximum`): llama-cpp-python's converter ignores them, as it does an integer's
(engine/grammar/integer_range.py). Pure; the schema converter uses it. A bounded number is written in plain decimal, without
an exponent (every number in a range can be), with at most FRACTION_DIGITS digits after the point."""

from __future__ import annotations

from decimal import Decimal

from edge_llm.engine.grammar.integer_range import integer_range_rule

FRACTION_DIGITS = 16  # as the converter's decimal-part


def number_range_rule(low: Decimal | None, high: Decimal | None, low_inclusive: bool = True,
                      high_inclusive: bool = True) -> str:
    """A GBNF expression matching exactly the plain decimal numbers v with low <= v <= high (< where not inclusive;
    None: unbounded), or "" when there are none."""
    alternatives: list[str] = []
    if low is None or low < 0:  # negatives: "-" and magnitudes in (0, -low] or [-high, -low]
        if high is not None and high < 0:
            magnitudes = _magnitudes(-high, high_inclusive, None if low is None else -low, low_inclusive)
        else:
            magnitudes = _magnitudes(Decimal(0), False, None if low is None else -low, low_inclusive)
        alternatives += [f'"-" ({pattern})' for pattern in magnitudes]
    if high is None or high >= 0:
        if low is None or low < 0:
            alternatives += _magnitudes(Decimal(0), True, high, high_inclusive)
        else:
            alternatives += _magnitudes(low, low_inclusive, high, high_inclusive)
    return " | ".join(f"({pattern})" for pattern in alternatives)


def _magnitudes(low: Decimal, low_inclusive: bool, high: Decimal | None, high_inclusive: bool) -> list[str]:
    """Patterns for the non-negative plain decimals in the range (low >= 0)."""
    if high is not None and (low > high or (low == high and not (low_inclusive and high_inclusive))):
        return []
    whole_low, fraction_low = _split(low)
    if high is None:
        patterns = [_with_fraction(str(whole_low), _at_least(fraction_low, low_inclusive))]
        if rest := integer_range_rule(whole_low + 1, None):
            patterns.append(f"({rest}) {_any_fraction()}")
        return [pattern for pattern in patterns if pattern]
    whole_high, fraction_high = _split(high)
    if whole_low == whole_high:
        return [_with_fraction(str(whole_low), _between(fraction_low, low_inclusive, fraction_high, high_inclusive))]
    patterns = [_with_fraction(str(whole_low), _at_least(fraction_low, low_inclusive))]
    if whole_low + 1 <= whole_high - 1 and (middle := integer_range_rule(whole_low + 1, whole_high - 1)):
        patterns.append(f"({middle}) {_any_fraction()}")
    patterns.append(_with_fraction(str(whole_high), _at_most(fraction_high, high_inclusive)))
    return [pattern for pattern in patterns if pattern]


def _split(value: Decimal) -> tuple[int, str]:
    """The whole part and the fraction's digits (no trailing zeros) of a non-negative decimal."""
    whole = int(value)
    digits = format(value - whole, "f").partition(".")[2].rstrip("0")
    return whole, digits


_DIGITS = "[0-9]"


def _any_fraction() -> str:
    return f'("." {_DIGITS}{{1,{FRACTION_DIGITS}}})?'


def _with_fraction(whole: str, fraction: tuple[bool, str]) -> str:
    """`whole`, then no fraction where `fraction[0]` allows it, or "." and digits matching `fraction[1]`."""
    bare, digits = fraction
    if not digits:
        return f'"{whole}"' if bare else ""
    return f'"{whole}" ("." ({digits})){"?" if bare else ""}'


# A fraction is compared digit by digit with a bound's digits (trailing zeros implied; a bound's digits have none).
# Each helper returns (whether no fraction at all, i.e. 0, qualifies; a pattern for the non-empty digit strings that
# do, or ""). The digits after the ones compared are capped at FRACTION_DIGITS (loosely: a long bound adds its own).
_TAIL = f"{_DIGITS}{{0,{FRACTION_DIGITS}}}"


def _at_least(bound: str, inclusive: bool) -> tuple[bool, str]:
    return (not bound and inclusive), _compare(bound, greater=True, inclusive=inclusive)


def _at_most(bound: str, inclusive: bool) -> tuple[bool, str]:
    return (bool(bound) or inclusive), _compare(bound, greater=False, inclusive=inclusive)


def _compare(bound: str, greater: bool, inclusive: bool) -> str:
    """Non-empty digit strings that are >= (greater) or <= the bound's digits (strictly where not inclusive), read as
    fractions."""
    if not bound:  # the bound is 0 from here on
        if greater:
            return f"{_DIGITS} {_TAIL}" if inclusive else f'"0"{{0,{FRACTION_DIGITS}}} [1-9] {_TAIL}'
        return f'"0"{{1,{FRACTION_DIGITS}}}' if inclusive else ""
    first, rest = int(bound[0]), bound[1:]
    options: list[str] = []
    others = (first + 1, 9) if greater else (0, first - 1)
    if others[0] <= others[1]:
        options.append(f"{_class(*others)} {_TAIL}")
    # The bound's own digit, then: the end of the string (the rest is 0 there), or more digits the rest decides.
    options += _digit_then(first, (not rest and inclusive) or (not greater and bool(rest)),
                           _compare(rest, greater, inclusive))
    return " | ".join(options)


def _digit_then(digit: int, ends: bool, tail: str) -> list[str]:
    """The digit, then the end of the string (where `ends`) or digits matching `tail` (where there is one)."""
    if not tail:
        return [f'"{digit}"'] if ends else []
    return [f'"{digit}" ({tail}){"?" if ends else ""}']


def _class(low: int, high: int) -> str:
    return f'"{low}"' if low == high else f"[{low}-{high}]"


def _between(low: str, low_inclusive: bool, high: str, high_inclusive: bool) -> tuple[bool, str]:
    """Fractions f with low <= f <= high (digit strings; strict where not inclusive; low below high, or equal and
    both inclusive)."""
    bare = _at_least(low, low_inclusive)[0] and _at_most(high, high_inclusive)[0]
    if not low and not high:  # both 0 from here on: zeros only
        return bare, f'"0"{{1,{FRACTION_DIGITS}}}' if bare else ""
    first_low, first_high = (int(low[0]) if low else 0), (int(high[0]) if high else 0)
    rest_low, rest_high = low[1:], high[1:]
    options: list[str] = []
    if first_low == first_high:
        return bare, " | ".join(_digit_then(first_low, *_between(rest_low, low_inclusive, rest_high, high_inclusive)))
    # The low digit, then at least the low's rest; digits in between, then anything; the high digit, then at most
    # the high's rest.
    options += _digit_then(first_low, *_at_least(rest_low, low_inclusive))
    options += _digit_then(first_high, *_at_most(rest_high, high_inclusive))
    if first_low + 1 <= first_high - 1:
        options.append(f"{_class(first_low + 1, first_high - 1)} {_TAIL}")
    return bare, " | ".join(options)
