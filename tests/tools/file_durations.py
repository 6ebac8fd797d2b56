"""Writes tests/file_durations.json, the wall time of each test file in a run of the suite, from that run's JUnit XML.
tests/conftest.py hands the files to the xdist workers longest first by this table.

    scripts/bootstrap.sh test --junitxml=test-artifacts/junit.xml
    .venv/bin/python -m tests.tools.file_durations test-artifacts/junit.xml

(run from the repository root, on a quiet machine, with the README's two workers: the times are only compared with
each other, so a busy machine skews the order less than it inflates the times)
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

from tests.file_order import DURATIONS_FILE


def test_file_of(classname: str) -> str:
    """`tests.unit.test_x.TestCase` → `tests/unit/test_x.py`: the longest dotted prefix that names a file."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if Path(path).is_file():
            return path
    raise ValueError(f"no test file for the JUnit class name {classname!r}")


def file_durations(junit_xml: Path) -> dict[str, float]:
    seconds: defaultdict[str, float] = defaultdict(float)
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        seconds[test_file_of(case.get("classname", ""))] += float(case.get("time", "0"))
    return {path: round(total, 1) for path, total in sorted(seconds.items(), key=lambda row: -row[1])}


def main() -> None:
    durations = file_durations(Path(sys.argv[1]))
    DURATIONS_FILE.write_text(json.dumps(durations, indent=1) + "\n")
    print(f"{DURATIONS_FILE}: {len(durations)} files, {sum(durations.values()):.0f} s in all")


if __name__ == "__main__":
    main()
