"""vocabulary.longest_piece: the longest piece found from the longest texts down (engine/llama/vocabulary.py)."""

from __future__ import annotations

from edge_llm.engine.llama.vocabulary import longest_piece


def test_stops_at_the_first_text_no_longer_than_the_longest_piece() -> None:
    texts = [3, 10, 7, 9, 2]
    pieces = [3, 4, 7, 8, 2]  # token 1's long text decodes to a short piece; token 3 has the longest piece
    asked: list[int] = []

    def piece_length(token: int) -> int:
        asked.append(token)
        return pieces[token]

    assert longest_piece(texts.__getitem__, piece_length, len(texts)) == 8
    assert asked == [1, 3]  # token 2's text (7) is no longer than 8: nothing after it is looked at


def test_looks_further_when_every_text_looked_at_is_longer_than_its_piece() -> None:
    n = 100
    texts = [1000 - t for t in range(n)]
    pieces = [1] * n
    pieces[80] = 5  # far down the order of text lengths
    assert longest_piece(texts.__getitem__, pieces.__getitem__, n, first_look=2) == 5


def test_an_empty_vocabulary_has_no_piece() -> None:
    assert longest_piece(lambda token: 0, lambda token: 0, 0) == 0
