"""A model file's sha256 (Ollama's `digest` in /api/tags, /api/ps): computed once per file version, off the event
loop, shared by the requests that ask meanwhile.

A catalogued model's file takes the catalogue's sha256 once it is verified (models/fetch.py keeps that check in a
stamp beside the file, so it is hashed at most once, ever); any other file is hashed (a 500 MB file takes a
second or two) and the result kept for as long as its size and modification time do not change.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from edge_llm.models.catalogue import CATALOGUE
from edge_llm.models.fetch import is_present, sha256_file

logger = logging.getLogger(__name__)

FileVersion = tuple[str, int, int]  # (path, size, mtime in ns)


def file_version(path: Path) -> FileVersion:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


def compute_digest(path: Path) -> str:
    """The file's sha256 (blocking: seconds for a large file)."""
    model = next((model for model in CATALOGUE if model.filename == path.name), None)
    if model is not None and path.stat().st_size == model.size and is_present(model, path.parent):
        return model.sha256
    logger.info("computing the sha256 of %s", path)
    return sha256_file(path)


class DigestCache:
    """Digests by file version; `digest` runs on the event loop, the hashing in a worker thread."""

    def __init__(self) -> None:
        self._known: dict[FileVersion, str] = {}
        self._running: dict[FileVersion, asyncio.Future[str]] = {}

    async def digest(self, path: Path) -> str:
        """Raises OSError when the file cannot be read."""
        version = await asyncio.to_thread(file_version, path)
        known = self._known.get(version)
        if known is not None:
            return known
        running = self._running.get(version)
        if running is None:
            running = self._running[version] = asyncio.ensure_future(asyncio.to_thread(compute_digest, path))
            running.add_done_callback(lambda done: self._finished(version, done))
        return await asyncio.shield(running)

    def _finished(self, version: FileVersion, done: asyncio.Future[str]) -> None:
        self._running.pop(version, None)
        if not done.cancelled() and done.exception() is None:
            self._known[version] = done.result()
