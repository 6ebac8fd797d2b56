"""The suite's file order for the xdist workers (tests/file_order.py): longest files first, files kept whole."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.file_order import NEW_FILE_SECONDS, longest_files_first


def _items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def _order(items: list[Any]) -> list[str]:
    return [item.nodeid for item in items]


def test_files_go_longest_first_and_each_file_stays_whole_in_its_own_order() -> None:
    items = _items("a.py::one", "a.py::two", "b.py::one", "c.py::one", "b.py::two")
    ordered = longest_files_first(items, {"a.py": 1.0, "b.py": 90.0, "c.py": 5.0})
    assert _order(ordered) == ["b.py::one", "b.py::two", "c.py::one", "a.py::one", "a.py::two"]


def test_an_unknown_file_counts_as_a_new_files_duration_and_ties_keep_collection_order() -> None:
    items = _items("fast.py::t", "new.py::t", "slow.py::t", "other_new.py::t")
    durations = {"fast.py": NEW_FILE_SECONDS - 1, "slow.py": NEW_FILE_SECONDS + 1}
    assert _order(longest_files_first(items, durations)) == ["slow.py::t", "new.py::t", "other_new.py::t", "fast.py::t"]
