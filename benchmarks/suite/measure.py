"""A quiet machine: wait until the CPUs are idle, count the CPU time other processes take during a measurement,
and measure again when they took too much (benchmarks/README.md, "A noisy machine")."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .plan import Plan

logger = logging.getLogger(__name__)


def _cpu_jiffies() -> tuple[int, int]:
    """(total, busy) CPU time of the machine so far, all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields), sum(fields) - idle


def _process_jiffies(pid: int) -> int:
    """utime + stime of a process (all its threads); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def cpu_busy_fraction(interval_s: float = 2.0) -> float:
    """The share of all CPU time that was busy over `interval_s` (from /proc/stat; 0.0 elsewhere)."""
    try:
        total0, busy0 = _cpu_jiffies()
        time.sleep(interval_s)
        total1, busy1 = _cpu_jiffies()
    except (OSError, ValueError, IndexError):
        return 0.0
    return (busy1 - busy0) / max(total1 - total0, 1)


def wait_for_quiet(phase: str, max_wait_s: float, threshold: float = 0.25) -> float:
    """Waits (at most `max_wait_s`) until other processes leave the CPUs mostly idle; returns the last busy share.

    Two llama.cpp threads on two cores slow down several-fold when anything else runs, so a
    phase measured on a busy machine says more about the neighbours than about the code.
    """
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_fraction()
    while busy > threshold and time.monotonic() < deadline:
        logger.info("%s: waiting for a quiet machine (CPU %.0f%% busy)", phase, busy * 100)
        time.sleep(5)
        busy = cpu_busy_fraction()
    if busy > threshold:
        logger.warning("%s: measuring on a busy machine (CPU %.0f%% busy)", phase, busy * 100)
    return busy


class CpuWatch:
    """The share of the machine's CPU time used by other processes than ours during a block."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = [os.getpid(), *pids]
        self.neighbour_share = 0.0

    def _own(self) -> int:
        return sum(_process_jiffies(pid) for pid in self.pids)

    def __enter__(self) -> CpuWatch:
        self._start = (*_cpu_jiffies(), self._own())
        return self

    def __exit__(self, *exc: object) -> None:
        total, busy = _cpu_jiffies()
        own = self._own()
        elapsed = total - self._start[0]
        others = (busy - self._start[1]) - (own - self._start[2])
        self.neighbour_share = max(0.0, others / elapsed) if elapsed > 0 else 0.0


MeasureResult = TypeVar("MeasureResult", bound=dict)


def measure_quietly(label: str, measure: Callable[[int], MeasureResult], pids: Sequence[int], plan: Plan,
                    threshold: float = 0.15) -> MeasureResult:
    """Runs `measure(attempt)` on a quiet machine; again (at most `plan.attempts` times in all) while other
    processes used more than `threshold` of the CPUs meanwhile. Returns the least disturbed attempt,
    with `neighbour_cpu` (that share) and `attempts` added."""
    best: dict[str, Any] | None = None
    for attempt in range(1, plan.attempts + 1):
        wait_for_quiet(label, plan.quiet_wait_s)
        with CpuWatch(pids) as watch:
            result = measure(attempt)
        result = {**result, "neighbour_cpu": watch.neighbour_share, "attempts": attempt}
        if best is None or watch.neighbour_share < best["neighbour_cpu"]:
            best = result
        if watch.neighbour_share <= threshold:
            break
        again = "; measuring again" if attempt < plan.attempts else "; keeping the least disturbed try"
        logger.warning("%s: other processes used %.0f%% of the CPUs meanwhile%s", label,
                       watch.neighbour_share * 100, again)
    return best  # type: ignore[return-value]
