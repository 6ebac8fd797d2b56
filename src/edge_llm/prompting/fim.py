"""Fill-in-the-middle: the prompt an editor's completion request becomes, and where the completion ends.

The layout is llama-server's (`format_prompt_infill`), the repository-level pattern the Qwen2.5-Coder report
trained for (arXiv 2409.12186), with one change — the text before the cursor is split where a block of lines
ends, and what follows (the block's lines typed so far, then `prompt`, the line typed so far) opens the middle
instead of closing the prefix:

    [FIM_REP]myproject\\n [FIM_SEP]name0\\n text0 … [FIM_SEP]filename\\n [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]block

The model reads the same text in the same order (prefix, suffix, then the middle as far as it is known) and
continues the middle either way, but each keystroke, and each new line within a block, now only appends to the
previous request's prompt: the prefix cache serves everything before it, with no chunk to move and no keys to
re-rotate (llama-server puts `prompt` before the suffix, so every keystroke changes its prompt in the middle; and
llama.cpp re-rotates every cell of the KV cache to move one chunk: ~40 ms at 8,192 cells here). A finished line
ends a block when its hash says so (one line in `BLOCK_ODDS`), as content-defined chunking cuts files: a block
stays put while lines are typed after it, and when the editor's window of lines before the cursor slides down
the file (llama.vscode and llama.vim send the last 256 lines), the prompt after the dropped first line is one
chunk that moves, not a new layout. When the block's finished lines pass `BLOCK_TOKENS`, or no block ends in the
last `BLOCK_SCAN_LINES` lines, the middle opens at the cursor's line. Every text is tokenized as plain
text, so code that happens to contain "<|fim_middle|>" stays text. The prefix keeps its last 3/4 of the window and
the suffix its first 1/4; the repository context fills what is left of the context before them, its newest tokens
first.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge_llm.engine.types import FimTokens

# llama-server fits prefix, prompt and suffix in one batch of its default n_batch (2048)
FIM_WINDOW = 2048
REPO_NAME = "myproject"
CURRENT_FILE = "filename"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # for models without a file separator token
FENCE = "```"
BLOCK_ODDS = 8  # one finished line in this many ends a block: a new line moves the suffix's keys that seldom
BLOCK_SCAN_LINES = 64  # finished lines looked at for a block's end
BLOCK_TOKENS = 256  # most tokens of finished lines the middle carries


@dataclass(frozen=True)
class ExtraFile:
    filename: str
    text: str


def infill_prompt(tokenize: Callable[[str], list[int]], fim: FimTokens, *, prefix: str, suffix: str,
                  prompt: str = "", extra: Sequence[ExtraFile] = (), n_predict: int, n_ctx: int,
                  bos: int | None = None) -> list[int]:
    """The prompt tokens of one fill-in-the-middle request (`tokenize`: plain text, no special tokens)."""
    prefix, middle = split_before_cursor(tokenize, prefix + prompt, fallback=len(prefix))
    prompt_tokens = tokenize(middle) if middle else []
    prefix_tokens = tokenize(prefix) if prefix else []
    suffix_tokens = tokenize(suffix) if suffix else []
    prefix_take = min(len(prefix_tokens), 3 * (FIM_WINDOW // 4))
    suffix_take = min(len(suffix_tokens), FIM_WINDOW // 4 - 2)  # not less as the line grows: keystrokes append
    head = [fim.prefix] + prefix_tokens[len(prefix_tokens) - prefix_take:]
    tail = [fim.suffix] + suffix_tokens[:suffix_take] + [fim.middle] + prompt_tokens
    if bos is not None:
        head.insert(0, bos)
    context = _repository_context(tokenize, fim, extra)
    room = max(0, n_ctx - FIM_WINDOW - BLOCK_TOKENS - 2 * n_predict)
    context = context[len(context) - min(room, len(context)):]
    return context + head + tail


def cursor_line_split(before: str) -> tuple[str, str]:
    """The text before the cursor as `/infill`'s prefix and prompt: the cursor's line typed so far is the prompt
    (on the first line, the prefix holds it), so that keystrokes append (`/v1/completions` with `suffix`)."""
    line_start = before.rfind("\n") + 1
    return (before[:line_start], before[line_start:]) if line_start else (before, "")


def ends_block(line: str) -> bool:
    """Whether a finished line (with its newline) ends a block: by its text alone, so that blocks stay where they
    are when lines are typed after them or the editor's window of lines before the cursor slides down the file."""
    return zlib.crc32(line.encode("utf-8", "surrogatepass")) % BLOCK_ODDS == 0


def split_before_cursor(tokenize: Callable[[str], list[int]], before: str, *, fallback: int) -> tuple[str, str]:
    """(prefix, middle): `before` split after its last finished line that `ends_block`; at `fallback` when none of
    the last `BLOCK_SCAN_LINES` does, or when the lines after it hold more than `BLOCK_TOKENS` tokens."""
    cursor_line = before.rfind("\n") + 1
    end = cursor_line
    for _ in range(BLOCK_SCAN_LINES):
        if end == 0:
            break
        start = before.rfind("\n", 0, end - 1) + 1
        if ends_block(before[start:end]):
            carried = before[end:cursor_line]
            if not carried or len(tokenize(carried)) <= BLOCK_TOKENS:
                return before[:end], before[end:]
            break
        end = start
    return before[:fallback], before[fallback:]


def suffix_echo_stop(suffix: str) -> tuple[str, ...]:
    """Stop strings for a completion with a suffix (`/v1/completions`; `/infill` has `EditorCut`): a Markdown
    fence on a new line (an instruction-tuned model has begun to explain), and a newline with the suffix's first
    non-blank line when that line is distinctive enough (8+ characters) not to end real code."""
    for line in suffix.splitlines():
        if line.strip():
            return ("\n" + FENCE,) + (("\n" + line.rstrip(),) if len(line.strip()) >= 8 else ())
    return ("\n" + FENCE,)


def _repository_context(tokenize: Callable[[str], list[int]], fim: FimTokens,
                        extra: Sequence[ExtraFile]) -> list[int]:
    tokens: list[int] = []
    if fim.repo is not None:
        tokens += [fim.repo] + tokenize(REPO_NAME + "\n")
    for chunk in extra:
        if fim.file_sep is not None:
            tokens += [fim.file_sep] + tokenize(chunk.filename + "\n")
        else:
            tokens += tokenize(SNIPPET_SEPARATOR)
        tokens += tokenize(chunk.text) if chunk.text else []
    if fim.file_sep is not None:
        tokens += [fim.file_sep] + tokenize(CURRENT_FILE + "\n")
    return tokens


INDENT = " \t"
ECHO_MATCH = 12  # a line that begins with this many characters of the suffix's first line repeats the suffix


class EditorCut:
    """Where an editor completion ends, applied to the text as it streams. From llama-server:

    - `n_indent`: after the first line, a line whose first character that is not a space or a tab sits left of
      column `n_indent` ends the completion there (the code has left the block being completed); the line's
      indentation is kept, the rest of it is cut. As in llama-server, a blank line counts as such a line.
    - `t_max_predict_ms`: text with a newline that arrives after this many milliseconds of generation ends the
      completion after that text (a time budget that never cuts a line in two).

    And for the middle's end, which instruction-tuned coder models often write past: after the first line, a
    line that starts like the suffix's first line (the model is writing the suffix again) or a Markdown fence
    (it has begun to explain) ends the completion before that line.

    The start of a line after the first is held back until these rules can tell whether it goes out.
    """

    def __init__(self, n_indent: int = 0, t_max_predict_ms: float = 0, suffix: str = "") -> None:
        self.n_indent = n_indent
        self.t_max_predict_ms = t_max_predict_ms
        anchor = next((line.strip() for line in suffix.splitlines() if line.strip()), "")
        self.anchor = anchor[:ECHO_MATCH]
        self.cut = False
        self._line = ""  # the held start of the current line
        self._open = True  # the current line goes out as it comes (the first line; a line judged fine)

    def feed(self, text: str, elapsed_ms: float) -> str:
        """The text that may be sent now; sets `cut` when the completion must end after it."""
        if self.cut:
            return ""
        out: list[str] = []
        for piece in text.splitlines(keepends=True):
            out.append(self._take(piece))
            if self.cut:
                return "".join(out)
        if "\n" in text and elapsed_ms > self.t_max_predict_ms > 0:
            self.cut = True
            out.append(self._line)
        return "".join(out)

    def finish(self) -> str:
        """What is still held back when the completion ends on its own."""
        held, self._line = self._line, ""
        return "" if self.cut else held  # a held line that no rule has cut by now is one no rule can cut

    def _take(self, piece: str) -> str:
        ends_line = piece.endswith("\n")
        if self._open:
            self._open = not ends_line
            return piece
        self._line += piece
        verdict = self._judge(self._line)
        if verdict is not None:
            self.cut = True
            return verdict
        if self._decided(self._line) or ends_line:
            line, self._line = self._line, ""
            self._open = not ends_line
            return line
        return ""

    def _judge(self, line: str) -> str | None:
        """None while the line may go out; else the completion ends, and this part of the line goes out."""
        body = line.lstrip(INDENT)
        indent = len(line) - len(body)
        stripped = body.strip()
        if body and indent < self.n_indent:  # a blank line has its newline for a body
            return line[:indent]
        if stripped.startswith(FENCE) or (self.anchor and stripped.startswith(self.anchor)):
            return ""
        return None

    def _decided(self, line: str) -> bool:
        """The line can no longer meet a rule: the rest of it goes out as it comes."""
        body = line.lstrip(INDENT)
        if not body.strip():
            return False
        return not (FENCE.startswith(body) or (self.anchor and self.anchor.startswith(body)))
