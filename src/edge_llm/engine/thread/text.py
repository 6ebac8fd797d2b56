"""Turning token bytes into safe text: incremental UTF-8 decoding and stop-string matching."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class Utf8Assembler:
    """Feeds raw token bytes, returns only complete characters.

    A multi-byte character split across tokens is held back until its last byte arrives;
    any split of a byte string gives the same text as decoding it whole.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Holds back text that might be the start of a stop string; cuts the text at the first match."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Returns the text safe to emit now; sets `stopped` once a stop string is seen."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._pending + text
        found = [(i, stop) for stop in self._stops if (i := buffer.find(stop)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda match: match[0])
            self.stopped = True
            self._pending = ""
            return buffer[:cut]
        keep = self._partial_suffix_length(buffer)
        self._pending = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """At the end of generation the held-back text was not a stop string after all."""
        text, self._pending = self._pending, ""
        return "" if self.stopped else text

    def _partial_suffix_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        for length in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0


class OutputText:
    """Token bytes in, client text out: UTF-8 assembly followed by stop matching."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._utf8 = Utf8Assembler()
        self._stops = StopMatcher(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stops.matched

    def feed(self, data: bytes) -> str:
        return self._stops.feed(self._utf8.feed(data))

    def finish(self) -> str:
        tail = self._stops.feed(self._utf8.flush())
        return tail + self._stops.flush()
