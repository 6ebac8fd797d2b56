"""docs/architecture.md's "Where things live" is the one list of the package's modules, and it matches the tree."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "edge_llm"
DOC = REPO / "docs" / "architecture.md"


def listed_paths() -> list[str]:
    """The entries of the list as paths under src/edge_llm/ (folders end in "/"), from its indentation."""
    section = DOC.read_text(encoding="utf-8").split("## Where things live", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block, "no code block under 'Where things live' in docs/architecture.md"
    lines = block.group(1).splitlines()
    assert lines[0] == "src/edge_llm/", lines[0]
    folders: list[str] = []  # the folder at each depth
    paths = []
    for line in lines[1:]:
        depth, rest = divmod(len(line) - len(line.lstrip(" ")), 2)
        assert not rest and depth >= 1, f"indent by two spaces a level: {line!r}"
        name = line.split()[0]
        del folders[depth - 1:]
        assert len(folders) == depth - 1, f"{name} is indented deeper than its folder"
        paths.append("".join(folders) + name)
        if name.endswith("/"):
            folders.append(name)
    return paths


def modules() -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def test_every_module_is_listed() -> None:
    missing = sorted(modules() - set(listed_paths()))
    assert not missing, f"add these to 'Where things live' in docs/architecture.md: {missing}"


def test_the_list_names_nothing_that_is_gone() -> None:
    paths = listed_paths()
    gone = [path for path in paths if not (PACKAGE / path).exists()]
    assert not gone, f"remove these from 'Where things live' in docs/architecture.md: {gone}"
    assert len(paths) == len(set(paths)), "an entry is listed twice"


def test_every_folder_of_modules_is_a_package() -> None:
    # setuptools' find_packages skips a folder without __init__.py: its modules would be missing from the wheel.
    folders = {(PACKAGE / module).parent for module in modules()}
    assert not [folder for folder in folders if not (folder / "__init__.py").is_file()]


def test_the_readme_points_to_the_list_instead_of_keeping_its_own() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/architecture.md#where-things-live" in readme
    assert "```\nsrc/edge_llm/" not in readme
