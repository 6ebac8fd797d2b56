"""The documentation: the MkDocs site builds with --strict (a broken link or anchor fails), every flag and route is
documented on its page, the benchmark plots the pages show are the ones benchmarks/plots.py draws, and the README
stays a newcomer's page with the two set-up commands."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.routing import BaseRoute

from edge_llm.api.app import create_app
from edge_llm.cli.bench import build_parser as build_bench_parser
from edge_llm.cli.main import build_parser
from edge_llm.config import Settings
from edge_llm.registry.registry import ModelRegistry

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# Where each command's flags are documented.
COMMAND_PAGES = {
    "edge-llm": DOCS / "configuration.md",
    "edge-llm serve": DOCS / "configuration.md",
    "edge-llm chat": DOCS / "chat.md",
    "edge-llm model list": DOCS / "models.md",
    "edge-llm model fetch": DOCS / "models.md",
    "edge-llm model info": DOCS / "models.md",
    "edge-llm run": DOCS / "api" / "ollama.md",
    "edge-llm pull": DOCS / "api" / "ollama.md",
    "edge-llm list": DOCS / "api" / "ollama.md",
    "edge-llm ls": DOCS / "api" / "ollama.md",
    "edge-llm ps": DOCS / "api" / "ollama.md",
    "edge-llm bench": REPO / "benchmarks" / "README.md",  # shown in the site by docs/benchmarks.md
}


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "scripts/bootstrap.sh serve" in home  # the README is the home page
    assert 'href="configuration/"' in home  # with its links re-pointed into the site
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    # benchmarks/README.md included, its headings with the anchors GitHub gives them
    assert "how each part is run and measured" in benchmarks and 'id="speculative-decoding---only-speculative-issue-17"' in benchmarks


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    site = tmp_path / "repo"
    for name in ("mkdocs.yml", "README.md", "CONTRIBUTING.md"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text((REPO / name).read_text(encoding="utf-8"), encoding="utf-8")
    for source in [*DOCS.rglob("*"), REPO / "scripts" / "docs_site.py", REPO / "benchmarks" / "README.md"]:
        if source.is_file():
            target = site / source.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    page = site / "docs" / "speculative.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n[gone](configuration.md#no-such-flag)\n", encoding="utf-8")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")], cwd=site,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode != 0
    assert "#no-such-flag" in build.stderr


def command_flags(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    """(command, --flag) for every long option of every (sub)command, without the implicit --no-… forms."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, subparser in action.choices.items():
                yield from command_flags(subparser, f"{name} {command}")
            continue
        for option in action.option_strings:
            if option.startswith("--") and option != "--help" and not option.startswith("--no-"):
                yield name, option


def all_flags() -> list[tuple[str, str]]:
    flags = [flag for flag in command_flags(build_parser(), "edge-llm") if flag[0] != "edge-llm bench"]
    return flags + list(command_flags(build_bench_parser(), "edge-llm bench"))


def test_every_flag_is_documented_on_its_page() -> None:
    flags = all_flags()
    assert ("edge-llm serve", "--ctx-size") in flags and ("edge-llm bench", "--concurrency") in flags
    assert {command for command, _ in flags} <= set(COMMAND_PAGES)
    def documented(flag: str, page: Path) -> bool:  # in code: `--flag N`, `model list [--dir DIR]`, a sh block
        spans = re.findall(r"```.*?```|`[^`]+`", page.read_text(encoding="utf-8"), re.DOTALL)
        return any(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", span) for span in spans)

    missing = [f"{command} {flag} (in {COMMAND_PAGES[command].relative_to(REPO)})" for command, flag in flags
               if not documented(flag, COMMAND_PAGES[command])]
    assert not missing, f"document these flags: {missing}"


def test_every_setting_has_its_row_in_the_configuration_table() -> None:
    rows = [line for line in (DOCS / "configuration.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `--")]
    for field in Settings.model_fields:
        if field == "config":
            continue
        flag = "--" + field.replace("_", "-")
        assert any(row.startswith(f"| `{flag} ") or row.startswith(f"| `{flag}`") for row in rows), flag
        row = next(row for row in rows if row.startswith(f"| `{flag} ") or row.startswith(f"| `{flag}`"))
        assert field == "models_dir" or f"`EDGE_LLM_{field.upper()}`" in row, f"{flag}: its variable"


def app_routes(routes: list[BaseRoute]) -> Iterator[tuple[str, str]]:
    for route in routes:
        if hasattr(route, "original_router"):  # an included router
            yield from app_routes(route.original_router.routes)  # type: ignore[attr-defined]
        elif hasattr(route, "methods"):
            for method in sorted(route.methods - {"HEAD"}) or sorted(route.methods):  # type: ignore[attr-defined]
                yield method, route.path  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def routes() -> list[tuple[str, str]]:
    registry = ModelRegistry([], lambda spec: None, default_model=None, keep_alive=300.0)  # type: ignore[arg-type]
    app = create_app(Settings(), registry=registry, on_fatal=lambda: None)
    return [route for route in app_routes(app.routes) if route[1] != "/docs/oauth2-redirect"]


def test_every_route_is_in_the_route_table(routes: list[tuple[str, str]]) -> None:
    table = (DOCS / "api" / "index.md").read_text(encoding="utf-8").split("## ")[0]
    documented = set(re.findall(r"`((?:GET|POST|DELETE|HEAD|PUT) /[^`\s]*)`", table))
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/api/tags") in routes
    missing = []
    for method, path in routes:
        pattern = re.compile(re.escape(f"{method} ") + re.sub(r"\\\{[^/]+\\\}", r"[^/]+", re.escape(path)) + "$")
        if not any(pattern.match(entry) for entry in documented):
            missing.append(f"{method} {path}")
    assert not missing, f"add these to the route table of docs/api/index.md: {missing}"


def test_the_pages_show_the_plots_the_script_draws(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "plots.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    drawn = {path.name for path in tmp_path.iterdir()}
    committed = {path.name for path in (DOCS / "plots").iterdir()}
    shown = {name for page in DOCS.rglob("*.md") for name in re.findall(r"\]\(plots/([^)]+)\)", page.read_text())}
    assert len(drawn) >= 5
    assert drawn == committed == shown


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120
    assert "scripts/bootstrap.sh serve" in readme and "scripts/bootstrap.sh test" in readme
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/bootstrap.sh test" in ci  # CI runs the README's test command
