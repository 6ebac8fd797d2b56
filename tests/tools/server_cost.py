"""A pytest plugin that says where the suite's time goes: per test file, how many server processes it started and
how much CPU the server processes (and every other child) spent while its tests ran, beside the test process's own
CPU and the wall time. CPU time, unlike wall time, does not grow when the machine is busy with other work.

    .venv/bin/python -m pytest -p tests.tools.server_cost tests/integration -q   # table: test-artifacts/server-cost.md

(run from the repository root; the table is rewritten after every test, so a run stopped early leaves one too)

A server is a child whose command line runs `edge_llm serve` or `tests.fault_server serve`. The CPU of a child that
is still running is read from /proc/PID/stat at each test's start and end (so a session-scoped server's work is
charged to the tests that used it); a child that exited during a test is charged through RUSAGE_CHILDREN, less what
earlier readings already charged. `EDGE_LLM_SERVER_COST=PATH` writes the table elsewhere. Linux only.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")
_OUTPUT_ENV = "EDGE_LLM_SERVER_COST"


@dataclass
class _Cost:
    tests: int = 0
    starts: int = 0
    child_cpu: float = 0.0
    own_cpu: float = 0.0
    wall: float = 0.0


@dataclass
class _Ledger:
    files: defaultdict[str, _Cost] = field(default_factory=lambda: defaultdict(_Cost))
    servers: dict[int, float] = field(default_factory=dict)  # live server pid -> CPU seconds last read
    current: str = "(collection)"


_LEDGER = _Ledger()
_Popen = subprocess.Popen


def _is_server(args: Any) -> bool:
    words = [str(word) for word in args] if isinstance(args, (list, tuple)) else str(args).split()
    return "serve" in words and any(word in ("edge_llm", "tests.fault_server") for word in words)


class _CountingPopen(_Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
        super().__init__(args, *rest, **options)
        if _is_server(args):
            _LEDGER.files[_LEDGER.current].starts += 1
            _LEDGER.servers[self.pid] = 0.0


subprocess.Popen = _CountingPopen  # type: ignore[misc]


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of proc(5))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _live_servers_cpu() -> float:
    """CPU the live servers spent since their last reading; a server gone since is dropped (RUSAGE_CHILDREN has its
    whole life, so what earlier readings charged is taken back)."""
    spent = 0.0
    for pid, before in list(_LEDGER.servers.items()):
        now = _cpu_of(pid)
        if now is None:
            spent -= before
            del _LEDGER.servers[pid]
        else:
            spent += now - before
            _LEDGER.servers[pid] = now
    return spent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    _LEDGER.current = item.nodeid.split("::", 1)[0]
    cost = _LEDGER.files[_LEDGER.current]
    _live_servers_cpu()
    children, own, wall = _children_cpu(), _own_cpu(), time.monotonic()
    yield
    cost.tests += 1
    cost.child_cpu += _children_cpu() - children + _live_servers_cpu()
    cost.own_cpu += _own_cpu() - own
    cost.wall += time.monotonic() - wall


def pytest_runtest_logfinish(nodeid: str) -> None:
    _write_table()  # after every test, so that a run stopped early still leaves its table


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What no test was charged with: children reaped after the last test, and the rest of those still running."""
    charged = sum(cost.child_cpu for cost in _LEDGER.files.values())
    _live_servers_cpu()
    _LEDGER.files["(session end)"].child_cpu += _children_cpu() + sum(_LEDGER.servers.values()) - charged
    _write_table()


def _write_table() -> None:
    rows = sorted(_LEDGER.files.items(), key=lambda row: -(row[1].child_cpu + row[1].own_cpu))
    lines = ["| file | tests | server starts | children CPU s | test process CPU s | wall s |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {cost.tests} | {cost.starts} | {cost.child_cpu:.1f} | {cost.own_cpu:.1f} | {cost.wall:.1f} |"
              for name, cost in rows]
    totals = _Cost(sum(c.tests for _, c in rows), sum(c.starts for _, c in rows), sum(c.child_cpu for _, c in rows),
                   sum(c.own_cpu for _, c in rows), sum(c.wall for _, c in rows))
    lines.append(f"| total | {totals.tests} | {totals.starts} | {totals.child_cpu:.1f} | {totals.own_cpu:.1f} "
                 f"| {totals.wall:.1f} |")
    output = Path(os.environ.get(_OUTPUT_ENV) or Path.cwd() / "test-artifacts" / "server-cost.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines) + "\n")
