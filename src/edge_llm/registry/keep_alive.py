"""Ollama's keep_alive values, parsed (pure).

keep_alive: a Go-style duration ("5m", "1h30m", "90s", "500ms"), a number of seconds (5, "5", 2.5), 0 (unload
after the request) or any negative value (-1, "-1m": never unload). Parsed to seconds, None meaning never.
"""

from __future__ import annotations

import re
from typing import Any

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
NEVER = None  # keep_alive: never unload
_MAX_DURATION_CHARS = 64  # "2562047h47m16.854775807s", Go's longest, has 24


def parse_keep_alive(value: Any) -> float | None:
    """Seconds to stay loaded after the last request; 0: unload at once; None: never. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a duration (\"5m\"), a number of seconds, 0 or -1")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _duration_seconds(value.strip())
    else:
        raise ValueError("keep_alive must be a duration (\"5m\"), a number of seconds, 0 or -1")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("keep_alive must be finite")
    return NEVER if seconds < 0 else seconds


def _duration_seconds(text: str) -> float:
    if len(text) > _MAX_DURATION_CHARS:
        raise ValueError(f"keep_alive is not a duration ({len(text)} characters): use e.g. \"5m\", \"90s\", "
                         "\"1h30m\", 0 or -1")
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)
    except ValueError:
        pass
    position, total = 0, 0.0
    while position < len(body):  # each part matched where the last ended: one attempt each, no rescans
        match = _DURATION.match(body, position)
        if match is None:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if not body or position != len(body):
        raise ValueError(f"keep_alive {text!r} is not a duration: use e.g. \"5m\", \"90s\", \"1h30m\", 0 or -1")
    return sign * total


def describe_keep_alive(seconds: float | None) -> str:
    if seconds is None:
        return "never unloaded"
    if seconds == 0:
        return "unloaded after each request"
    return f"unloaded after {seconds:g} s idle"
