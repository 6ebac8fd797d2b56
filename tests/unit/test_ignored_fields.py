"""api/params.py's record of ignored keys: each named once, in order, however many there are."""

from __future__ import annotations

from edge_llm.api.params import report_ignored, track_ignored_fields


def test_ignored_keys_are_recorded_once_each_in_order() -> None:
    fields = track_ignored_fields()
    report_ignored(["b", "a", "b"])
    report_ignored(["a", "c"])
    assert fields == ["b", "a", "c"]


def test_forty_thousand_ignored_keys_are_all_recorded() -> None:
    # A list membership test per key made this quadratic: 40,000 unknown keys held the event loop 20 s (issue 41).
    fields = track_ignored_fields()
    paths = [f"k{k}" for k in range(40_000)]
    report_ignored(paths)
    report_ignored(paths[:10])
    assert fields == paths
