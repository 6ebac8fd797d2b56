"""MkDocs hook (mkdocs.yml `hooks:`): the site's home page is README.md and its contributing page CONTRIBUTING.md,
so each text is written once, for the repository; their links, relative to the repository root, are re-pointed
to the site's pages here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# site page → the repository file it shows
SHOWN = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md"}
_LINK = re.compile(r"\]\((?!https?:|#)([^)\s]+)\)")


def _site_target(target: str) -> str:
    if target.startswith("docs/"):
        return target.removeprefix("docs/")
    shown = {file: page for page, file in SHOWN.items()}
    path, _, anchor = target.partition("#")
    if path in shown:
        return shown[path] + (f"#{anchor}" if anchor else "")
    raise ValueError(f"{target}: a link from a page the site shows must lead to docs/ or to {sorted(shown)}")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    source = SHOWN.get(page.file.src_uri)
    if source is None:
        return markdown
    text = (REPO / source).read_text(encoding="utf-8")
    return _LINK.sub(lambda match: f"]({_site_target(match.group(1))})", text)
