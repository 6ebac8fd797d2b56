"""The command line's one progress bar (`edge-llm model fetch`, `edge-llm bench`, the benchmark suite)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """`label [#####.....]  40% 2/5 12.3s` on stderr, redrawn in place on a terminal; elsewhere (a log
    file) one plain line every 20%, so the log is not flooded with carriage returns.

    Call it with (done, total); the line ends when done reaches total, or at `close()` (which is safe to
    call any time, e.g. in a `finally` after an error).
    """

    def __init__(self, label: str, *, scale: float = 1.0, unit: str = "", width: int = 25,
                 stream: TextIO | None = None) -> None:
        self.label = label
        self.scale = scale  # 1e6 with unit " MB" shows byte counts in megabytes
        self.unit = unit
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._percent = -1
        self._open = False  # a redrawn line that still needs its newline

    def __call__(self, done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent == self._percent:
            return
        figures = (f"{done / self.scale:.0f}/{total / self.scale:.0f}{self.unit} "
                   f"{time.monotonic() - self.started:.1f}s")
        if self.stream.isatty():
            filled = self.width * percent // 100
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {percent:3d}% {figures}")
            self._open = True
        elif self._percent < 0 or percent // 20 != self._percent // 20:
            self.stream.write(f"{self.label}: {percent}% {figures}\n")
        self._percent = percent
        if done >= total:
            self.close()
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
