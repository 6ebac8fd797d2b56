"""No module of src/edge_llm over 400 lines: a longer one is split by responsibility (house rule).

Three modules are over it while open work changes them (notes-38.md, 4 Dec): they are named here until their split
lands, and the test fails as soon as one of them is back under the limit, so that the list only shrinks.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "edge_llm"
MAX_LINES = 400
BEING_SPLIT = {"api/protocol.py", "api/serving/base.py"}


def line_counts() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in PACKAGE.rglob("*.py")}


def test_no_module_over_400_lines() -> None:
    long = {name: count for name, count in line_counts().items() if count > MAX_LINES and name not in BEING_SPLIT}
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"


def test_the_modules_being_split_are_still_listed_only_while_over() -> None:
    counts = line_counts()
    done = {name for name in BEING_SPLIT if counts.get(name, 0) <= MAX_LINES}
    assert not done, f"under {MAX_LINES} lines now (or gone): take them out of BEING_SPLIT: {done}"
