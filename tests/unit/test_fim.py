"""Fill-in-the-middle prompts and the editor's stop rules (prompting/fim.py), with a toy tokenizer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.engine.types import FimTokens
from edge_llm.prompting.fim import (
    BLOCK_ODDS,
    BLOCK_SCAN_LINES,
    BLOCK_TOKENS,
    FIM_WINDOW,
    EditorCut,
    ExtraFile,
    cursor_line_split,
    ends_block,
    infill_prompt,
    split_before_cursor,
    suffix_echo_stop,
)

PRE, SUF, MID, REP, SEP = 1001, 1002, 1003, 1004, 1005
QWEN_LIKE = FimTokens(PRE, SUF, MID, repo=REP, file_sep=SEP)
BARE = FimTokens(PRE, SUF, MID)


def chars(text: str) -> list[int]:
    """One token per character: a tokenizer whose output is easy to read back."""
    return [ord(c) for c in text]


def text_of(tokens: list[int]) -> str:
    names = {PRE: "<PRE>", SUF: "<SUF>", MID: "<MID>", REP: "<REP>", SEP: "<SEP>"}
    return "".join(names.get(t, chr(t)) for t in tokens)


def test_the_layout_is_llama_servers_repository_pattern_with_the_typed_line_opening_the_middle() -> None:
    tokens = infill_prompt(chars, QWEN_LIKE, prefix="def f():\n    ", suffix="\nf()\n", prompt="ret",
                           extra=[ExtraFile("a.py", "A=1\n"), ExtraFile("b.py", "B=2\n")], n_predict=16, n_ctx=8192)
    assert text_of(tokens) == ("<REP>myproject\n<SEP>a.py\nA=1\n<SEP>b.py\nB=2\n<SEP>filename\n"
                               "<PRE>def f():\n    <SUF>\nf()\n<MID>ret")


def test_a_model_without_repository_tokens_gets_snippet_separators_and_a_bos() -> None:
    tokens = infill_prompt(chars, BARE, prefix="x = ", suffix="", extra=[ExtraFile("a.py", "A")], n_predict=4,
                           n_ctx=8192, bos=7)
    assert text_of(tokens) == "\n\n--- snippet ---\n\nA" + chr(7) + "<PRE>x = <SUF><MID>"


def test_control_token_spellings_in_code_stay_text() -> None:
    seen: list[str] = []

    def tokenize(text: str) -> list[int]:
        seen.append(text)
        return chars(text)

    tokens = infill_prompt(tokenize, QWEN_LIKE, prefix="s = '<|fim_middle|>'", suffix="", n_predict=4, n_ctx=8192)
    assert tokens.count(MID) == 1 and tokens[-1] == MID  # only the layout's own
    assert "s = '<|fim_middle|>'" in seen


def test_long_prefix_keeps_its_end_and_long_suffix_its_beginning() -> None:
    prefix = "p" * 5000 + "END"
    suffix = "START" + "s" * 5000
    tokens = infill_prompt(chars, BARE, prefix=prefix, suffix=suffix, prompt="ab", n_predict=16, n_ctx=8192)
    text = text_of(tokens)
    body_prefix = text[text.index("<PRE>") + 5:text.index("<SUF>")]
    body_suffix = text[text.index("<SUF>") + 5:text.index("<MID>")]
    assert body_prefix.endswith("END") and len(body_prefix) == 3 * FIM_WINDOW // 4
    assert body_suffix.startswith("START") and len(body_suffix) == FIM_WINDOW // 4 - 2
    assert text.endswith("<MID>ab")


def test_a_keystroke_appends_to_the_previous_prompt() -> None:
    file = dict(prefix="def area(r):\n" * 400, suffix="\nprint(area(2))\n" * 200, n_predict=32, n_ctx=8192)
    before = infill_prompt(chars, QWEN_LIKE, prompt="    return 3.1", **file)
    after = infill_prompt(chars, QWEN_LIKE, prompt="    return 3.14159 *", **file)
    assert after[:len(before)] == before


def test_repository_context_is_cut_to_what_the_context_leaves_keeping_its_newest_part() -> None:
    extra = [ExtraFile(f"f{i}.py", "x" * 1000) for i in range(10)]
    tokens = infill_prompt(chars, QWEN_LIKE, prefix="a", suffix="b", extra=extra, n_predict=100, n_ctx=4096)
    head = tokens[:tokens.index(PRE)]
    assert len(head) == 4096 - FIM_WINDOW - BLOCK_TOKENS - 2 * 100
    assert text_of(head).endswith("<SEP>filename\n")


def test_suffix_echo_stop_is_a_fence_and_the_first_distinctive_line() -> None:
    assert suffix_echo_stop("\n\nprint(fibonacci(10))\n") == ("\n```", "\nprint(fibonacci(10))")
    assert suffix_echo_stop("\n    return total  \n") == ("\n```", "\n    return total")
    assert suffix_echo_stop("\n}\n") == ("\n```",)  # too common to end on
    assert suffix_echo_stop("   \n") == ("\n```",)


def test_a_line_that_starts_writing_the_suffix_again_ends_the_middle() -> None:
    cut = EditorCut(suffix="\n\nprint(add_numbers(2, 3))\n")
    parts = ["return a", " + b\n", "\n", "print(add_", "numbers(5, 7))\n", "more\n"]
    assert feed_all(cut, parts) == "return a + b\n\n"
    assert cut.cut


def test_a_markdown_fence_ends_the_middle_and_other_lines_stream_as_they_come() -> None:
    cut = EditorCut(suffix="\nprint(x)\n")
    assert cut.feed("x = 1\n", 0) == "x = 1\n"
    assert cut.feed("y", 0) == "y"  # cannot start a fence or the suffix: sent at once
    assert cut.feed(" = 2\n`", 0) == " = 2\n"  # held: may be a fence
    assert cut.feed("``\nThis code", 0) == ""
    assert cut.cut


def feed_all(cut: EditorCut, parts: list[str], times: list[float] | None = None) -> str:
    times = times or [0.0] * len(parts)
    return "".join(cut.feed(part, at) for part, at in zip(parts, times)) + cut.finish()


def test_n_indent_cuts_at_the_first_line_left_of_the_block_keeping_its_indentation() -> None:
    cut = EditorCut(n_indent=4)
    assert feed_all(cut, ["x = 1\n", "    ", "y = 2\n  ", "z", " = 3\n"]) == "x = 1\n    y = 2\n  "
    assert cut.cut


def test_n_indent_lets_deeper_lines_through_and_never_checks_the_first_line() -> None:
    cut = EditorCut(n_indent=4)
    assert feed_all(cut, ["a\n", "    b\n", "        c", "\n"]) == "a\n    b\n        c\n"
    assert not cut.cut


def test_t_max_predict_ms_ends_at_the_first_newline_after_the_budget() -> None:
    cut = EditorCut(t_max_predict_ms=10)
    out = [cut.feed(part, at) for part, at in [("a", 1), ("b\n", 5), ("c", 20), ("d\ne", 30), ("f", 40)]]
    assert out == ["a", "b\n", "c", "d\ne", ""] and cut.cut


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["a", "b ", " ", "  ", "\t", "\n", "x\n", "    y", "\n  "]), max_size=30),
       st.integers(0, 6))
def test_editor_cut_sends_a_prefix_of_the_text_and_holds_nothing_back_in_the_end(parts: list[str],
                                                                                 n_indent: int) -> None:
    cut = EditorCut(n_indent=n_indent)
    sent = feed_all(cut, parts)
    whole = "".join(parts)
    assert whole.startswith(sent)
    if not cut.cut:
        assert sent == whole


def code_lines(count: int, *, ending_block: bool, width: int = 12, skip: int = 0) -> list[str]:
    """`count` distinct finished lines that do (or do not) end a block."""
    found: list[str] = []
    i = skip
    while len(found) < count:
        line = f"    v{i} = {i}".ljust(width) + "\n"
        if ends_block(line) == ending_block:
            found.append(line)
        i += 1
    return found


FILE_END = dict(suffix="\nprint(main())\n" * 50, n_predict=32, n_ctx=8192)
BLOCK_END = code_lines(1, ending_block=True)[0]
INSIDE = code_lines(12, ending_block=False)  # lines that end no block


def middle_of(tokens: list[int]) -> str:
    text = text_of(tokens)
    return text[text.index("<MID>") + 5:]


def test_about_one_line_in_block_odds_ends_a_block() -> None:
    share = sum(ends_block(f"x{i} = f({i})\n") for i in range(4000)) / 4000
    assert abs(share - 1 / BLOCK_ODDS) < 0.03


def test_a_new_line_within_a_block_appends_to_the_previous_prompt() -> None:
    head = "".join(INSIDE[:3]) + BLOCK_END + "".join(INSIDE[3:6])
    typed_line = INSIDE[6].rstrip("\n")
    before = infill_prompt(chars, QWEN_LIKE, prefix=head, prompt=typed_line, **FILE_END)
    after = infill_prompt(chars, QWEN_LIKE, prefix=head + typed_line + "\n", prompt="    ", **FILE_END)
    assert after[:len(before)] == before
    assert middle_of(after) == "".join(INSIDE[3:7]) + "    "


def test_the_middle_opens_after_the_last_line_that_ends_a_block() -> None:
    head = "".join(INSIDE[:2]) + BLOCK_END + "".join(INSIDE[2:4]) + BLOCK_END + INSIDE[4]
    tokens = infill_prompt(chars, QWEN_LIKE, prefix=head, prompt="    x", **FILE_END)
    text = text_of(tokens)
    assert text[text.index("<PRE>") + 5:text.index("<SUF>")] == head.removesuffix(INSIDE[4])
    assert middle_of(tokens) == INSIDE[4] + "    x"


def test_a_window_of_lines_sliding_down_the_file_keeps_the_middle() -> None:
    """llama.vscode sends the last N lines before the cursor: a new line drops the first one. The prompt after
    it is the previous prompt's, whole, with the new line's tokens at its end."""
    file = INSIDE[:4] + [BLOCK_END] + INSIDE[4:8]
    before = infill_prompt(chars, QWEN_LIKE, prefix="".join(file[:8]), prompt=file[8].rstrip("\n"), **FILE_END)
    after = infill_prompt(chars, QWEN_LIKE, prefix="".join(file[1:9]), prompt="", **FILE_END)
    dropped, head = len(file[0]), before.index(PRE) + 1
    assert after[:head] == before[:head]
    assert after[head:len(before) - dropped] == before[head + dropped:]


def test_without_a_block_end_or_after_a_long_block_the_middle_opens_at_the_cursors_line() -> None:
    no_end = infill_prompt(chars, QWEN_LIKE, prefix="".join(INSIDE[:5]), prompt="    x", **FILE_END)
    assert middle_of(no_end) == "    x"
    wide = code_lines(3, ending_block=False, width=BLOCK_TOKENS // 2, skip=1000)  # two of them pass BLOCK_TOKENS
    long_block = infill_prompt(chars, QWEN_LIKE, prefix=BLOCK_END + "".join(wide), prompt="    x", **FILE_END)
    assert middle_of(long_block) == "    x"
    far = BLOCK_END + "".join(code_lines(BLOCK_SCAN_LINES, ending_block=False, skip=2000))
    assert middle_of(infill_prompt(chars, QWEN_LIKE, prefix=far, prompt="    x", **FILE_END)) == "    x"


def test_v1_completions_text_puts_the_cursors_line_in_the_middle() -> None:
    assert cursor_line_split("def f():\n    ret") == ("def f():\n", "    ret")
    assert cursor_line_split("x = ") == ("x = ", "")


def reference_split(before: str) -> tuple[str, str]:
    """split_before_cursor written the slow, obvious way: over the list of finished lines."""
    *finished, _cursor_line = before.split("\n")
    lines = [line + "\n" for line in finished]
    ends = [sum(len(line) for line in lines[:i + 1]) for i in range(len(lines))]
    cursor_start = ends[-1] if ends else 0
    for i in range(len(lines) - 1, max(-1, len(lines) - 1 - BLOCK_SCAN_LINES), -1):
        if ends_block(lines[i]):
            carried = before[ends[i]:cursor_start]
            if len(carried) <= BLOCK_TOKENS:
                return before[:ends[i]], before[ends[i]:]
            break
    return before[:cursor_start], before[cursor_start:]


@settings(max_examples=400)
@given(st.lists(st.sampled_from(["\n", "x\n", "  \n", BLOCK_END, INSIDE[0], INSIDE[1], "a = 1\n", "w" * 90 + "\n"]),
                max_size=12),
       st.sampled_from(["", "    ret", "x"]))
def test_the_split_before_the_cursor_is_after_the_last_finished_line_that_ends_a_block(lines: list[str],
                                                                                     typed: str) -> None:
    before = "".join(lines) + typed
    assert split_before_cursor(chars, before, fallback=len(before) - len(typed)) == reference_split(before)


def inside_line(length: int) -> str:
    """A finished line of `length` characters (its newline included) that ends no block."""
    return next(line for c in "yzwvutsrqponmlk" if not ends_block(line := c * (length - 1) + "\n"))


def test_lines_carried_into_the_middle_may_hold_block_tokens_and_no_more() -> None:
    exact = inside_line(BLOCK_TOKENS)
    assert split_before_cursor(chars, BLOCK_END + exact + "z", fallback=0) == (BLOCK_END, exact + "z")
    over = inside_line(BLOCK_TOKENS + 1)
    assert split_before_cursor(chars, BLOCK_END + over + "z", fallback=0) == ("", BLOCK_END + over + "z")


def test_a_line_with_a_lone_surrogate_is_hashed_like_any_other() -> None:
    """A JSON body's "\\ud800" escape reaches the prompt as a lone surrogate: hashing it must not raise."""
    share = sum(ends_block(f"\ud800 = {i}\n") for i in range(800)) / 800
    assert abs(share - 1 / BLOCK_ODDS) < 0.05


def test_the_cursors_line_is_after_the_last_newline() -> None:
    assert cursor_line_split("a\nb\n    c") == ("a\nb\n", "    c")


def test_a_suffix_line_of_eight_characters_is_distinctive_enough_and_of_seven_not() -> None:
    assert suffix_echo_stop("\n  abcdefgh\n") == ("\n```", "\n  abcdefgh")
    assert suffix_echo_stop("\nabcdefg\n") == ("\n```",)


def test_no_room_leaves_no_repository_context_and_every_snippet_is_kept() -> None:
    tokens = infill_prompt(chars, QWEN_LIKE, prefix="a", suffix="b", extra=[ExtraFile("f.py", "x" * 100)],
                           n_predict=4000, n_ctx=4096)
    assert tokens[0] == PRE
    bare = infill_prompt(chars, BARE, prefix="a", suffix="", extra=[ExtraFile("a.py", "A"), ExtraFile("b.py", "B")],
                         n_predict=4, n_ctx=8192)
    assert text_of(bare).startswith("\n\n--- snippet ---\n\nA\n\n--- snippet ---\n\nB<PRE>")


def test_an_editor_cut_without_options_passes_every_line_but_a_fence() -> None:
    cut = EditorCut()
    assert cut.anchor == "" and cut.cut is False
    assert cut.feed("a\n", 0) == "a\n"
    assert cut.feed("XXXX\nb\n", 10_000) == "XXXX\nb\n"  # no time budget, no suffix to echo
    assert cut.cut is False and cut.finish() == ""


def test_the_time_budget_is_passed_only_after_its_last_millisecond() -> None:
    at_budget = EditorCut(t_max_predict_ms=10)
    assert at_budget.feed("a\n", 10) == "a\n" and not at_budget.cut
    assert at_budget.feed("b\n", 10.5) == "b\n" and at_budget.cut
    one_ms = EditorCut(t_max_predict_ms=1)
    one_ms.feed("a\n", 2)
    assert one_ms.cut


def test_a_time_cut_sends_the_held_start_of_a_line_and_nothing_after() -> None:
    cut = EditorCut(t_max_predict_ms=5, suffix="\nprint(x)\n")
    assert cut.feed("a\n", 0) == "a\n"
    assert cut.feed("pri", 1) == ""  # may be the suffix again: held
    assert cut.feed("\n", 6) == "pri\n" and cut.cut
    assert cut.finish() == "" and cut.feed("more\n", 7) == ""


def test_a_cut_in_the_middle_of_a_piece_sends_the_lines_before_it_whole() -> None:
    cut = EditorCut(n_indent=4)
    assert cut.feed("a\n    b\n  c\n", 0) == "a\n    b\n  "
    assert cut.feed("    d\n", 0) == "" and cut.finish() == ""


def test_the_first_line_streams_in_pieces_without_any_rule() -> None:
    cut = EditorCut(n_indent=4)
    assert [cut.feed(p, 0) for p in ["def f(", "x):\n", "    return x\n"]] == ["def f(", "x):\n", "    return x\n"]
    assert not cut.cut


def test_n_indent_of_one_cuts_a_line_at_column_zero_and_a_blank_line_cuts_too() -> None:
    one = EditorCut(n_indent=1)
    assert one.feed("a\n b\nX = 1\n", 0) == "a\n b\n" and one.cut
    blank = EditorCut(n_indent=4)
    assert blank.feed("a\n  \n    y\n", 0) == "a\n  " and blank.cut
    empty = EditorCut(n_indent=4)
    assert empty.feed("a\n\n    y\n", 0) == "a\n" and empty.cut


def test_a_line_held_when_the_completion_ends_goes_out_once() -> None:
    cut = EditorCut(n_indent=4)
    assert cut.feed("a\n    ``", 0) == "a\n"  # the second line may be a fence: held
    assert cut.finish() == "    ``"
    assert cut.finish() == ""


def test_a_line_goes_out_as_soon_as_it_can_be_neither_a_fence_nor_the_suffix() -> None:
    cut = EditorCut(suffix="\ndef main():\n")
    cut.feed("a\n", 0)
    assert cut.feed("X", 0) == "X"
    assert cut.feed("\n", 0) == "\n"
    assert cut.feed("de", 0) == ""  # may begin "def main():"
    assert cut.feed("x\n", 0) == "dex\n"
    assert cut.feed("  ``", 0) == ""  # may be a fence
    assert cut.feed("`py\n", 0) == "" and cut.cut
