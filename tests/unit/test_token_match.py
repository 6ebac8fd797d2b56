"""Finding a chunk of an old prompt again, moved, in a new one (engine/scheduling/token_match.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge_llm.engine.scheduling.token_match import common_prefix_length, moved_chunk


def test_typed_and_deleted_text_move_the_rest_forward_and_back() -> None:
    old = list(range(50))
    typed = old[:20] + [900, 901] + old[20:]
    assert moved_chunk(old, typed, 20, len(typed) - 1, 8) == (20, 22, 29)  # up to the last token, never it
    deleted = old[:20] + old[25:]
    assert moved_chunk(old, deleted, 20, len(deleted) - 1, 8) == (25, 20, 24)
    assert moved_chunk(old, typed, 20, len(typed) - 1, 40) is None  # shorter than asked for
    assert moved_chunk(old, typed, 20, len(typed) - 1, 0) is None


def test_the_longest_chunk_is_moved_when_lines_change_sides_of_the_suffix() -> None:
    lines, suffix = list(range(100, 110)), list(range(200, 230))
    old = [1] + suffix + [2] + lines + [3]  # the lines were in the middle, after the suffix
    new = [1] + lines + suffix + [2, 4]  # now they end the prefix
    assert moved_chunk(old, new, 1, len(new) - 1, 8) == (1, 11, 31)  # the suffix and the token after it


@given(old=st.lists(st.integers(0, 4), max_size=60), new=st.lists(st.integers(0, 4), max_size=60),
       min_length=st.integers(1, 6))
def test_a_found_chunk_is_equal_in_both_after_the_common_prefix(old: list[int], new: list[int],
                                                                min_length: int) -> None:
    start = min(common_prefix_length(old, new), max(len(new) - 1, 0))
    limit = max(len(new) - 1, 0)
    found = moved_chunk(old, new, start, limit, min_length)
    if found is None:
        return
    old_start, new_start, length = found
    assert length >= min_length and old_start >= start and new_start >= start and new_start + length <= limit
    assert old[old_start:old_start + length] == new[new_start:new_start + length]
