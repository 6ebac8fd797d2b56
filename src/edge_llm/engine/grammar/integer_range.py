"""GBNF for the JSON integers within a schema's bounds (`minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum`): llama-cpp-python's schema converter ignores them, so `{"type": "integer", "minimum": 0}`
let the model write -4. Pure; runner's converter uses it. Numbers are written without leading zeros (JSON), at most
MAX_DIGITS digits where a side is unbounded (the converter's integral-part allows 16)."""

from __future__ import annotations

MAX_DIGITS = 16


def integer_range_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression (without the trailing space) matching exactly the integers in [low, high] (None:
    unbounded), or "" when there are none."""
    if low is not None and high is not None and low > high:
        return ""
    alternatives: list[str] = []
    if low is None or low < 0:  # negatives: "-" and the magnitudes in [max(1, -high), -low]
        magnitudes = _magnitudes(1 if high is None or high >= 0 else -high, None if low is None else -low)
        alternatives += [f'"-" {pattern}' for pattern in magnitudes]
    if high is None or high >= 0:
        alternatives += _magnitudes(0 if low is None or low < 0 else low, high)
    return " | ".join(f"({pattern})" for pattern in alternatives)


def _magnitudes(low: int, high: int | None) -> list[str]:
    """Patterns for the non-negative integers in [low, high], each of one digit count."""
    patterns: list[str] = []
    for digits in range(len(str(low)), MAX_DIGITS + 1):
        start = 0 if digits == 1 else 10 ** (digits - 1)
        end = 10**digits - 1
        lo, hi = max(low, start), end if high is None else min(high, end)
        if lo > hi:  # (low never passes this count's end: the counts start at low's) high is below it: done
            break
        if high is None and lo == start and digits > 1:  # every longer number too: one pattern for the rest
            patterns.append(f"[1-9] [0-9]{{{digits - 1},{MAX_DIGITS - 1}}}")
            break
        patterns += _same_length(lo, hi, digits)
    return patterns


def _same_length(lo: int, hi: int, digits: int) -> list[str]:
    """Patterns for [lo, hi], both of `digits` digits: pieces [x, x + 10^k - 1] (x a multiple of 10^k), those with a
    common prefix and consecutive last varying digits merged into a character class."""
    pieces: list[tuple[int, int]] = []  # (x, k)
    while lo <= hi:
        k = 0
        while k + 1 < digits and lo % 10 ** (k + 1) == 0 and lo + 10 ** (k + 1) - 1 <= hi:
            k += 1
        pieces.append((lo, k))
        lo += 10**k
    patterns: list[str] = []
    i = 0
    while i < len(pieces):
        x, k = pieces[i]
        j = i
        # (the pieces are consecutive by construction: only their size and their parent decide)
        while (j + 1 < len(pieces) and pieces[j + 1][1] == k
               and pieces[j + 1][0] // 10 ** (k + 1) == x // 10 ** (k + 1)):
            j += 1
        text = str(x).zfill(digits)
        prefix, first = text[: digits - k - 1], text[digits - k - 1]
        last = str(pieces[j][0]).zfill(digits)[digits - k - 1]
        parts = [f'"{prefix}"'] if prefix else []
        parts.append(f'"{first}"' if first == last else f"[{first}-{last}]")
        if k:
            parts.append(f"[0-9]{{{k}}}")
        patterns.append(" ".join(parts))
        i = j + 1
    return patterns
