"""api/params.py's record of ignored keys: each named once, in order, however many there are."""

from __future__ import annotations

from edge_llm.api.params import report_ignored
from edge_llm.api.request_context import RequestContext
from edge_llm.api.telemetry import RequestRecord


def new_context() -> RequestContext:
    return RequestContext(RequestRecord("req", "POST", "/v1/chat/completions", 0.0))


def test_ignored_keys_are_recorded_once_each_in_order() -> None:
    context = new_context()
    report_ignored(context, ["b", "a", "b"])
    report_ignored(context, ["a", "c"])
    assert context.ignored_fields == ["b", "a", "c"]


def test_forty_thousand_ignored_keys_are_all_recorded() -> None:
    # A list membership test per key made this quadratic: 40,000 unknown keys held the event loop 20 s (issue 41).
    context = new_context()
    paths = [f"k{k}" for k in range(40_000)]
    report_ignored(context, paths)
    report_ignored(context, paths[:10])
    assert context.ignored_fields == paths
