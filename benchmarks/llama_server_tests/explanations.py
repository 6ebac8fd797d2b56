"""Why each remaining failure of llama.cpp's server tests fails here: (file, test-id prefix) → one line."""

from __future__ import annotations

MODEL_TEXT = "expects the text stories260K writes (the tests' model); the default model writes other text"

REASONS: list[tuple[str, str, str]] = [
]


def explain(file: str, test: str) -> str | None:
    for reason_file, prefix, reason in REASONS:
        if reason_file == file and test.startswith(prefix):
            return reason
    return None
