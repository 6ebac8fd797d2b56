"""The order in which test files reach the xdist workers: longest first (by tests/file_durations.json, refreshed by
tests/tools/file_durations.py), so that no long file starts last and runs alone on one worker while the other idles.
A file the table does not know yet counts as NEW_FILE_SECONDS: early enough that a slow new file does not form the
tail, later than the known slow ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).parent / "file_durations.json"
NEW_FILE_SECONDS = 30.0


def longest_files_first(items: list[pytest.Item], durations: dict[str, float]) -> list[pytest.Item]:
    """The items with whole files reordered by descending duration; within a file, and between files of equal
    duration, collection order stays."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def key(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return (-durations.get(path, NEW_FILE_SECONDS), first_seen[path])

    return sorted(items, key=key)


def recorded_durations() -> dict[str, float]:
    return json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.is_file() else {}
