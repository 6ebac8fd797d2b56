"""What Ollama's CLI verbs print (cli/ollama_verbs.py): sizes and times as Ollama's own `list` and `ps` write them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from edge_llm.cli.ollama_verbs import human_duration, human_size, human_time, ollama_host

NOW = datetime(2026, 12, 4, 4, 0, tzinfo=timezone.utc)


def at(delta: timedelta) -> str:
    return (NOW + delta).isoformat().replace("+00:00", "Z")


def test_durations_read_as_ollamas_format_package_writes_them() -> None:
    cases = {0.4: "Less than a second", 1: "1 second", 59: "59 seconds", 60: "About a minute",
             299: "4 minutes", 3599: "59 minutes", 3600: "About an hour", 5400: "2 hours", 9000: "3 hours", 47 * 3600: "47 hours",
             48 * 3600: "2 days", 13 * 86400: "13 days", 15 * 86400: "2 weeks", 70 * 86400: "2 months",
             800 * 86400: "2 years"}
    assert {seconds: human_duration(seconds) for seconds in cases} == cases


def test_times_are_ago_from_now_or_forever() -> None:
    assert human_time(at(-timedelta(hours=3)), NOW) == "3 hours ago"
    assert human_time(at(timedelta(minutes=4, seconds=59)), NOW) == "4 minutes from now"
    assert human_time("2319-03-16T04:06:31.931875Z", NOW) == "Forever"  # keep_alive -1
    assert human_time(at(timedelta(days=365 * 19)), NOW) == "19 years from now"
    assert human_time("2026-12-04T05:00:00+01:00", NOW) == "Less than a second ago"  # offsets are honoured
    assert human_time("not a time", NOW) == "not a time"


def test_sizes_use_decimal_units_as_ollama_does() -> None:
    assert [human_size(size) for size in (999, 1000, 253_113_024, 963_535_360, 4_700_000_000)] == \
        ["999 B", "1 KB", "253.1 MB", "963.5 MB", "4.7 GB"]


def test_ollama_host_is_read_as_ollama_reads_it() -> None:
    assert ollama_host("127.0.0.1:3000") == "http://127.0.0.1:3000"
    assert ollama_host("0.0.0.0") == "http://127.0.0.1:11434"  # Ollama's port when none is given
    assert ollama_host("0.0.0.0:8080") == "http://127.0.0.1:8080"
    assert ollama_host(":3000") == "http://127.0.0.1:3000"
    assert ollama_host("gpu-box") == "http://gpu-box:11434"
    assert ollama_host("[::1]:3000") == "http://[::1]:3000" and ollama_host("[::]") == "http://[::1]:11434"
    assert ollama_host("https://llm.example.com") == "https://llm.example.com"  # a URL is taken as it is
