"""Where two token sequences agree: the common prefix, and a chunk of an old prompt found again, moved, in a new one."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def moved_chunk(old: Sequence[int], new: Sequence[int], start: int, limit: int,
                min_length: int) -> tuple[int, int, int] | None:
    """(old_start, new_start, length) of the longest run of at least `min_length` tokens of new[start:limit] that
    also appears in old[start:], extended as far as both agree: what a small edit before it left unchanged (the
    rest of the file after a keystroke). The longest, not the first: when lines move from after the suffix to
    before it (fill-in-the-middle), the lines come first and the suffix, longer, is what must not be computed
    again. None when there is no such run."""
    if min_length <= 0 or limit - start < min_length or len(old) - start < min_length:
        return None
    first_seen: dict[tuple[int, ...], int] = {}
    for position in range(start, len(old) - min_length + 1):
        first_seen.setdefault(tuple(old[position:position + min_length]), position)
    best: tuple[int, int, int] | None = None
    new_start = start
    while new_start <= limit - min_length:
        old_start = first_seen.get(tuple(new[new_start:new_start + min_length]))
        if old_start is None:
            new_start += 1
            continue
        length = min_length
        while (new_start + length < limit and old_start + length < len(old)
               and old[old_start + length] == new[new_start + length]):
            length += 1
        if best is None or length > best[2]:
            best = (old_start, new_start, length)
        new_start += length
    return best
