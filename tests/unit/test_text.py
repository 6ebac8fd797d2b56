"""Incremental UTF-8 assembly and stop-string matching (engine/thread/text.py)."""

from __future__ import annotations

from itertools import combinations

import pytest

from edge_llm.engine.thread.text import OutputText, StopMatcher, Utf8Assembler

SAMPLES = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 😀🎉 and 👩‍👩‍👧 family",
    "mixed: aé日😀z",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u0000nul and \u007fdel",
]


def splits(data: bytes, max_cuts: int = 2):
    """Every way of cutting `data` into up to max_cuts+1 consecutive pieces."""
    n = len(data)
    for k in range(0, max_cuts + 1):
        for cuts in combinations(range(1, n), k):
            bounds = (0, *cuts, n)
            yield [data[a:b] for a, b in zip(bounds, bounds[1:])]


def assemble(pieces: list[bytes]) -> tuple[str, list[str]]:
    assembler = Utf8Assembler()
    outputs = [assembler.feed(p) for p in pieces]
    outputs.append(assembler.flush())
    return "".join(outputs), outputs


# ---- Utf8Assembler ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", SAMPLES)
def test_every_split_into_two_or_three_pieces_decodes_like_the_whole(text: str) -> None:
    data = text.encode("utf-8")
    count = 0
    for pieces in splits(data, max_cuts=2):
        result, _ = assemble(pieces)
        assert result == text, pieces
        count += 1
    assert count > len(data)  # the generator really produced many splits


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_by_byte_feed_emits_only_complete_characters(text: str) -> None:
    assembler = Utf8Assembler()
    emitted = []
    for byte in text.encode("utf-8"):
        out = assembler.feed(bytes([byte]))
        assert "\ufffd" not in out
        emitted.append(out)
    assert assembler.flush() == ""
    assert "".join(emitted) == text


def test_multibyte_character_is_held_until_its_last_byte() -> None:
    emoji = "😀".encode("utf-8")
    assert len(emoji) == 4
    assembler = Utf8Assembler()
    assert assembler.feed(b"ab" + emoji[:1]) == "ab"
    assert assembler.feed(emoji[1:3]) == ""
    assert assembler.feed(emoji[3:] + "日".encode()[:2]) == "😀"
    assert assembler.feed("日".encode()[2:]) == "日"


def test_incomplete_tail_is_flushed_as_replacement_character() -> None:
    assembler = Utf8Assembler()
    assert assembler.feed("x日".encode()[:-1]) == "x"
    assert assembler.flush() == "\ufffd"
    assert assembler.flush() == ""


def test_invalid_bytes_become_replacement_like_bytes_decode() -> None:
    data = b"ok\xff\xfe" + "é".encode() + b"\x80"
    result, _ = assemble([data[:3], data[3:5], data[5:]])
    assert result == data.decode("utf-8", errors="replace")
    assert result.count("\ufffd") == 3


# ---- StopMatcher -------------------------------------------------------------------------------


def run_matcher(stops: list[str], pieces: list[str]) -> tuple[str, list[str], StopMatcher]:
    matcher = StopMatcher(stops)
    outputs = [matcher.feed(p) for p in pieces]
    outputs.append(matcher.flush())
    return "".join(outputs), outputs, matcher


def text_splits(text: str, max_cuts: int = 2):
    n = len(text)
    for k in range(0, max_cuts + 1):
        for cuts in combinations(range(1, n), k):
            bounds = (0, *cuts, n)
            yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize(
    ("text", "stop", "before"),
    [
        ("Hello world<|end|>garbage after", "<|end|>", "Hello world"),
        ("one\n\nUser: more", "\n\nUser:", "one"),
        ("日本語STOP続き", "STOP", "日本語"),
        ("😀😀😀", "😀😀", ""),
        ("abababc", "ababc", "ab"),  # overlapping self-similar stop
    ],
)
def test_stop_split_anywhere_never_leaks_and_prefix_is_exact(text: str, stop: str, before: str) -> None:
    for pieces in text_splits(text, max_cuts=3 if len(text) <= 16 else 2):
        result, outputs, matcher = run_matcher([stop], pieces)
        assert matcher.stopped, pieces
        assert result == before, pieces
        # not even a partial stop string ever leaves: the output is exactly the text before the stop
        assert stop not in result
        for out in outputs:
            assert not (set(out) - set(before)) or out == ""


def test_every_prefix_of_the_stop_is_held_back_then_released() -> None:
    stop = "<|eot|>"
    for cut in range(1, len(stop)):
        matcher = StopMatcher([stop])
        assert matcher.feed("text" + stop[:cut]) == "text"
        # the held-back part turns out not to be the stop
        assert matcher.feed("!") == stop[:cut] + "!"
        assert not matcher.stopped


def test_held_back_prefix_released_at_flush() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.feed("end </") == "end "
    assert matcher.flush() == "</"
    assert not matcher.stopped


def test_partial_prefix_then_real_stop_in_later_feed() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("aST") == "a"
    assert matcher.feed("xST") == "STx"
    assert matcher.feed("O") == ""
    assert matcher.feed("P tail") == ""
    assert matcher.stopped
    assert matcher.flush() == ""
    assert matcher.feed("more") == ""


def test_earliest_stop_wins_among_several() -> None:
    result, _, matcher = run_matcher(["world", "lo w"], ["hel", "lo wor", "ld"])
    assert matcher.stopped
    assert result == "hel"
    result, _, _ = run_matcher(["zz", "b"], ["aaab", "zz"])
    assert result == "aaa"


def test_earliest_stop_wins_for_every_split() -> None:
    text = "xxENDyySTOPzz"
    for pieces in text_splits(text, max_cuts=2):
        result, _, matcher = run_matcher(["STOP", "END"], pieces)
        assert result == "xx", pieces
        assert matcher.stopped


def test_stop_prefix_that_is_prefix_of_another_stop() -> None:
    # "ab" could grow into "abc" (a stop) or be "ab" followed by "d" (another stop "abd")
    result, _, matcher = run_matcher(["abc", "abd"], ["x", "a", "b", "d", "tail"])
    assert matcher.stopped
    assert result == "x"


def test_no_stops_passes_text_through_unchanged() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("<|im_end|>") == "<|im_end|>"
    assert matcher.flush() == ""
    matcher = StopMatcher(["", ""])  # empty stop strings are ignored
    assert matcher.feed("abc") == "abc"
    assert not matcher.stopped


def test_text_without_stop_is_emitted_exactly() -> None:
    text = "a < b and c <| d"
    for pieces in text_splits(text, max_cuts=2):
        result, _, matcher = run_matcher(["<|end|>"], pieces)
        assert result == text
        assert not matcher.stopped


# ---- OutputText ----------------------------------------------------------------------------


def test_output_text_combines_utf8_and_stop_matching() -> None:
    data = "答え: 42😀<STOP>ignored".encode()
    for cut1 in range(1, len(data)):
        output = OutputText(["<STOP>"])
        out = output.feed(data[:cut1]) + output.feed(data[cut1:])
        out += output.finish()
        assert out == "答え: 42😀", cut1
        assert output.stopped


def test_output_text_stop_made_of_multibyte_characters() -> None:
    data = "前置き終わり後".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    output = OutputText(["終わり"])
    emitted = "".join(output.feed(p) for p in pieces)
    assert "終" not in emitted
    assert emitted + output.finish() == "前置き"


def test_output_text_finish_flushes_incomplete_tail_and_held_prefix() -> None:
    output = OutputText(["<e"])
    assert output.feed(b"hi <") == "hi "
    assert output.feed("日".encode()[:2]) == ""  # no complete character yet: "<" still held
    assert output.finish() == "<\ufffd"
    assert not output.stopped


def test_output_text_finish_keeps_held_back_prefix() -> None:
    output = OutputText(["</s>"])
    assert output.feed(b"x</") == "x"
    assert output.finish() == "</"


def test_output_text_without_stops() -> None:
    output = OutputText()
    assert output.feed("é".encode()[:1]) == ""
    assert output.feed("é".encode()[1:]) == "é"
    assert output.finish() == ""
    assert not output.stopped
