"""Suite-wide set-up: the package's bytecode, compiled once per session.

This checkout is an editable install, and CI and the sandbox run with PYTHONDONTWRITEBYTECODE set, so without
`__pycache__` every server a test starts would compile each of the package's ~150 modules again (0.15-0.3 s of CPU
per start, issue 40); `pip install` and the Docker image compile them at install time, as this does here.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

import edge_llm


def pytest_sessionstart(session: pytest.Session) -> None:  # noqa: ARG001 - pytest's hook signature
    compileall.compile_dir(Path(edge_llm.__file__).parent, quiet=1)
