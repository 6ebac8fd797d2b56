"""No module of src/edge_llm over 400 lines: a longer one is split by responsibility (house rule)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "edge_llm"
MAX_LINES = 400


def line_counts() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in PACKAGE.rglob("*.py")}


def test_no_module_over_400_lines() -> None:
    long = {name: count for name, count in line_counts().items() if count > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by responsibility): {long}"
