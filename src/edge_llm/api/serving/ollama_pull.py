"""POST /api/pull: a catalogue model fetched as `edge-llm model fetch` does (models/fetch.py), its progress streamed
as Ollama's NDJSON status lines: `pulling manifest`, `pulling <digest>` with `total` / `completed`, `verifying
sha256 digest`, `writing manifest`, `success` (or one `{"error": …}` line).

The fetch runs in a worker thread, one per model at a time: every pull of a model that is being fetched follows the
same fetch (as Ollama's do), and a client that leaves does not stop it. The file is assembled beside its target
and renamed into place only once its sha256 is verified, so nothing half-written is ever served. Where it goes:
--models-dir when the server serves a directory, where the model then becomes servable at once; with --model alone,
the models directory of `edge-llm model fetch`, served from the next start with --models-dir.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from edge_llm.api.params import parse_body
from edge_llm.api.request_context import request_context
from edge_llm.api.protocol.errors import ollama_error
from edge_llm.api.protocol.ollama_models import ProgressResponse, PullRequest, ollama_json
from edge_llm.api.serving.body import request_json
from edge_llm.api.errors import APIError
from edge_llm.config import Settings
from edge_llm.models.catalogue import CATALOGUE, UnknownCatalogueModel, find
from edge_llm.models.fetch import ChunkedModel, ModelFileError, fetch, models_dir
from edge_llm.models.digest import DigestCache
from edge_llm.registry.names import NameTaken
from edge_llm.registry.registry import ModelRegistry, UnknownModelError
from edge_llm.registry.specs import spec_for_path

logger = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


@dataclass(eq=False)
class PullJob:
    """One catalogue model being fetched into one directory."""

    model: ChunkedModel
    directory: Path
    completed: int = 0
    error: str | None = None
    note: str | None = None  # a status line to send before `success`
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def advance(self, completed: int) -> None:  # on the event loop
        self.completed = completed
        self._notify()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class PullServing:
    def __init__(self, settings: Settings, registry: ModelRegistry, digests: DigestCache) -> None:
        self.settings = settings
        self.registry = registry
        self.digests = digests
        self._jobs: dict[tuple[str, Path], PullJob] = {}

    async def pull(self, request: Request) -> Response:
        if not (await request.body()).strip():
            raise APIError(400, "missing request body", code="invalid_json")
        body = parse_body(request_context(request), PullRequest, await request_json(request),
                          strict=self.settings.strict_params)
        wanted = body.model or body.name
        if not wanted:
            raise APIError(400, "model is required", param="model")
        lines = self._lines(wanted)
        if body.stream is False:  # Ollama's answer is then the last status line, or the error alone
            last: dict[str, Any] = {}
            async for line in lines:
                if "error" in line:
                    return JSONResponse(line, status_code=404 if self._unknown(wanted) else 500)
                last = line
            return JSONResponse(last)
        return StreamingResponse(_ndjson(lines), media_type=NDJSON)

    def _unknown(self, wanted: str) -> bool:
        try:
            find(wanted)
            return False
        except UnknownCatalogueModel:
            pass
        try:
            self.registry.resolve(wanted)
            return False
        except UnknownModelError:
            return True

    async def _lines(self, wanted: str) -> AsyncIterator[dict[str, Any]]:
        yield ollama_json(ProgressResponse(status="pulling manifest"))
        try:
            model = find(wanted)
        except UnknownCatalogueModel:
            async for line in self._served(wanted):
                yield line
            return
        async for line in self._fetched(model):
            yield line

    async def _fetched(self, model: ChunkedModel) -> AsyncIterator[dict[str, Any]]:
        job = self._job(model)
        sent = -1
        while True:
            finished = job.task is not None and job.task.done()
            completed = model.size if finished and job.error is None else job.completed
            if completed != sent:
                yield _pulling(model.sha256, model.size, completed)
                sent = completed
            if finished:
                break
            await job.changed.wait()
        if job.error is not None:
            yield dict(ollama_error(job.error))
            return
        for line in _finish(job.note):
            yield line

    async def _served(self, wanted: str) -> AsyncIterator[dict[str, Any]]:
        """A name the catalogue does not know: a model already served is there (success), any other is Ollama's
        error for a name its library does not have."""
        try:
            entry = self.registry.resolve(wanted)
        except UnknownModelError:
            names = ", ".join(model.ollama_name or model.catalogue_name for model in CATALOGUE)
            yield dict(ollama_error(f"pull model manifest: file does not exist ('{wanted}' is not in the catalogue, "
                                    f"which has: {names})"))
            return
        size = entry.spec.path.stat().st_size
        yield _pulling(await self.digests.digest(entry.spec.path), size, size)
        for line in _finish(None):
            yield line

    def _job(self, model: ChunkedModel) -> PullJob:
        directory = (self.settings.models_dir.expanduser().absolute() if self.registry.on_demand
                     and self.settings.models_dir is not None else models_dir())
        key = (model.filename, directory)
        job = self._jobs.get(key)
        if job is None or (job.task is not None and job.task.done()):
            job = self._jobs[key] = PullJob(model, directory)
            job.task = asyncio.get_running_loop().create_task(self._run(job), name=f"pull {model.filename}")
        return job

    async def _run(self, job: PullJob) -> None:
        loop = asyncio.get_running_loop()

        def progress(done: int, total: int) -> None:  # in the fetch's thread
            loop.call_soon_threadsafe(job.advance, done)

        try:
            logger.info("pulling %s into %s", job.model.filename, job.directory)
            path = await asyncio.to_thread(fetch, job.model, job.directory, progress)
            job.note = await self._serve(path)
        except (ModelFileError, OSError) as exc:
            logger.error("pulling %s failed: %s", job.model.filename, exc)
            job.error = str(exc)
        finally:
            job.advance(job.completed)
            self._jobs.pop((job.model.filename, job.directory), None)

    async def _serve(self, path: Path) -> str | None:
        """The fetched file added to the served models (when serving a directory); a note for the user, if any."""
        if not self.registry.on_demand:
            logger.info("pulled %s: this server serves --model only; serve it with --models-dir %s", path,
                        path.parent)
            return (f"fetched into {path.parent}; this server serves --model only: start it with --models-dir "
                    f"{path.parent} to serve it")
        if any(entry.spec.path == path or (entry.spec.path.exists() and entry.spec.path.samefile(path))
               for entry in self.registry.entries):
            return None
        spec = await asyncio.to_thread(spec_for_path, self.settings, path)
        try:
            self.registry.add(spec)
        except NameTaken as exc:
            logger.warning("pulled %s, but its name %r is another model's: not served", path, exc.name)
            return f"fetched into {path}, but its name '{exc.name}' is another model's: not served"
        logger.info("now serving %s (pulled)", spec.name)
        return None


def _pulling(digest: str, total: int, completed: int) -> dict[str, Any]:
    return ollama_json(ProgressResponse(status=f"pulling {digest[:12]}", digest=f"sha256:{digest}", total=total,
                                        completed=completed))


def _finish(note: str | None) -> list[dict[str, Any]]:
    statuses = ["verifying sha256 digest", "writing manifest", *([note] if note else []), "success"]
    return [{"status": status} for status in statuses]


async def _ndjson(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for line in lines:
        yield (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
