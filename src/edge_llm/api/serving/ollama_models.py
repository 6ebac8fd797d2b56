"""Ollama's model management: GET /api/tags, POST /api/show, GET /api/ps, DELETE /api/delete, POST /api/copy,
GET /api/version, and the refusals of /api/create and /api/push (POST /api/pull is ollama_pull.py). This family
serves the model registry, not one model's engine; its errors leave in Ollama's envelope (api/errors.py).

What is listed is what the server can serve: the registry's models, loaded or not (with --model alone, that
model), by their Ollama names (registry/names.py). GGUF facts come from the header and digests from the file,
each read once per file version in a worker thread (never on the event loop)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from fastapi import Request

from edge_llm.api.errors import APIError
from edge_llm.api.params import parse_body
from edge_llm.api.request_context import request_context
from edge_llm.api.protocol.ollama_models import (
    CopyRequest,
    DeleteRequest,
    ListModel,
    ListResponse,
    ProcessModel,
    ProcessResponse,
    ShowRequest,
    ShowResponse,
    VersionResponse,
    ollama_json,
)
from edge_llm.api.serving import ollama_describe as describe
from edge_llm.api.serving.body import request_json
from edge_llm.config import Settings
from edge_llm.models.catalogue import CATALOGUE
from edge_llm.models.digest import DigestCache, FileVersion, file_version
from edge_llm.models.gguf_info import GGUFInfoError, ModelFacts, read_model_facts
from edge_llm.models.gguf_tokens import fim_texts
from edge_llm.registry.names import NameTaken, tagged, valid_ollama_name
from edge_llm.registry.registry import ModelEntry, ModelRegistry, ModelState, UnknownModelError

logger = logging.getLogger(__name__)

FimTexts = tuple[str, str, str] | None

# The Ollama version /api/version reports: clients check a minimum (VS Code Copilot Chat wants 0.6.4 or later);
# 0.9.0 is the release whose API (`think`, tool calls in streams, structured outputs) the /api routes follow.
OLLAMA_VERSION = "0.9.0"
COPILOT_CHAT_AGENT = "GitHubCopilotChat/"  # Ollama names the requested model in general.basename for it


def not_found(name: str) -> APIError:
    return APIError(404, f"model '{name}' not found", code="model_not_found", param="model")


class OllamaModelServing:
    def __init__(self, settings: Settings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.digests = DigestCache()
        self._headers: dict[FileVersion, tuple[ModelFacts, FimTexts]] = {}

    # ---- reading -----------------------------------------------------------------------------------

    async def tags(self) -> dict[str, Any]:
        listed = []
        for entry in self.registry.entries:
            try:
                digest = await self.digests.digest(entry.spec.path)
                version = file_version(entry.spec.path)
            except OSError as exc:  # deleted or unreadable behind the server's back: not servable either
                logger.warning("model %s is not listed: %s", entry.name, exc)
                continue
            for name in (entry.spec.ollama_name, *(tagged(copy) for copy in entry.copies)):
                listed.append(ListModel(name=name, model=name, modified_at=describe.file_time(version[2]),
                                        size=version[1], digest=digest, details=self._details(entry)))
        return ListResponse(models=listed).model_dump()

    async def show(self, request: Request) -> dict[str, Any]:
        body = await self._parse(request, ShowRequest)
        wanted = body.model or body.name
        if not wanted:
            raise APIError(400, "model is required", param="model")
        entry = self._entry(wanted)
        facts, fim = await self._header(entry.spec.path)
        info = describe.model_info(await asyncio.to_thread(read_model_facts, entry.spec.path, max_keep=None)
                                   if body.verbose else facts, verbose=body.verbose)
        if request.headers.get("user-agent", "").startswith(COPILOT_CHAT_AGENT):
            info["general.basename"] = wanted  # as Ollama does: Copilot shows general.basename as the model's name
        values = describe.parameters(self.settings)
        answer = ShowResponse(
            license=_text(facts.metadata.get("general.license")),
            modelfile=describe.modelfile(entry.spec.ollama_name, facts, values),
            parameters=describe.parameters_text(values),
            template=describe.template(facts, fim),
            details=describe.details(facts.architecture, facts.parameter_count, facts.quantization),
            model_info=info,
            capabilities=describe.capabilities(facts, fim is not None),
            modified_at=describe.file_time(file_version(entry.spec.path)[2]),
        )
        return ollama_json(answer)

    async def ps(self) -> dict[str, Any]:
        running = []
        for entry in self.registry.entries:
            if entry.state is not ModelState.LOADED:
                continue
            try:
                digest = await self.digests.digest(entry.spec.path)
            except OSError:
                digest = ""
            name = entry.spec.ollama_name
            running.append(ProcessModel(name=name, model=name, size=entry.spec.memory_bytes, digest=digest,
                                        details=self._details(entry), expires_at=describe.expiry(self._left(entry)),
                                        context_length=self.settings.sequence_context))
        running.sort(key=lambda model: model.expires_at, reverse=True)  # as Ollama: the longest left first
        return ProcessResponse(models=running).model_dump()

    @staticmethod
    def version() -> dict[str, Any]:
        return VersionResponse(version=OLLAMA_VERSION).model_dump()

    # ---- changing --------------------------------------------------------------------------------

    async def copy(self, request: Request) -> None:
        """An alias for the server's lifetime (the config file's `model_aliases` keeps one across restarts)."""
        body = await self._parse(request, CopyRequest)
        if not valid_ollama_name(body.destination):  # Ollama's words; a name no Ollama client could type back
            raise APIError(400, f"destination {json.dumps(body.destination)} is invalid", param="destination")
        try:
            entry = self.registry.resolve(body.source)
        except UnknownModelError:
            raise APIError(404, f'model "{body.source}" not found', code="model_not_found", param="source") from None
        try:
            self.registry.add_copy(body.destination, entry)
        except NameTaken as exc:
            other = exc.owner.name if isinstance(exc.owner, ModelEntry) else str(exc.owner)
            raise APIError(400, f"destination {body.destination!r} is already the name of the model '{other}'; "
                           "delete that model first", param="destination") from None
        logger.info("model %s is also called %s (until the server stops)", entry.name, body.destination)

    async def delete(self, request: Request) -> None:
        """A copy's name is forgotten; a catalogued model's file fetched into --models-dir is removed, once it is
        unloaded and unused. Never the --model file, nor a file the catalogue does not know (the user's own)."""
        body = await self._parse(request, DeleteRequest)
        wanted = body.model or body.name
        if not wanted:
            raise APIError(400, "model is required", param="model")
        if self.registry.remove_copy(wanted) is not None:
            logger.info("forgot the name %s", wanted)
            return
        entry = self._entry(wanted)
        path = entry.spec.path
        if not self.registry.on_demand or self._is_model_flag(path):
            raise APIError(409, f"model '{wanted}' is the one --model serves: it is not deleted while the server "
                           "runs", code="model_in_use", param="model")
        if all(model.filename != path.name for model in CATALOGUE):
            raise APIError(409, f"model '{wanted}' is not a catalogue model but your own file ({path}): remove it "
                           "yourself", code="not_a_catalogue_model", param="model")
        while entry.state is ModelState.UNLOADING and entry.task is not None:
            await asyncio.shield(entry.task)  # `ollama rm` unloads the model (keep_alive 0) just before
        if entry.holds_memory or entry.leases or entry.waiters:
            busy = f" with {entry.leases} requests in flight" if entry.leases else ""
            raise APIError(409, f"model '{wanted}' is {entry.state.value}{busy}: unload it first (POST "
                           "/models/unload, or a request with keep_alive 0), then delete it",
                           code="model_in_use", param="model")
        self.registry.remove(entry)
        for doomed in (path, path.with_name(path.name + ".verified")):
            doomed.unlink(missing_ok=True)
        logger.info("deleted model %s (%s)", entry.name, path)

    @staticmethod
    def not_offered(what: str) -> APIError:
        return APIError(501, f"{what} is not offered by this server: it serves GGUF files as they are (put one in "
                        "--models-dir, or fetch a catalogue model with /api/pull)", code="not_implemented")

    # ---- helpers ---------------------------------------------------------------------------------

    async def _parse(self, request: Request, model: type[Any]) -> Any:
        if not (await request.body()).strip():
            raise APIError(400, "missing request body", code="invalid_json")
        return parse_body(request_context(request), model, await request_json(request),
                          strict=self.settings.strict_params)

    def _entry(self, name: str) -> ModelEntry:
        try:
            return self.registry.resolve(name)
        except UnknownModelError:
            raise not_found(name) from None

    def _is_model_flag(self, path: Path) -> bool:
        if "model" not in self.settings.model_fields_set:
            return False
        flag = self.settings.model.absolute()
        return flag == path or (flag.exists() and path.exists() and flag.samefile(path))

    async def _header(self, path: Path) -> tuple[ModelFacts, FimTexts]:
        try:
            version = file_version(path)
            known = self._headers.get(version)
            if known is None:
                known = self._headers[version] = await asyncio.to_thread(_read_header, path)
            return known
        except (OSError, GGUFInfoError) as exc:
            raise APIError(500, f"cannot read the model file {path}: {exc}", code="model_unreadable") from None

    @staticmethod
    def _details(entry: ModelEntry) -> Any:
        facts = entry.spec.facts
        return describe.details(str(facts.get("architecture", "")), int(facts.get("n_params") or 0),
                                str(facts.get("quantization", "")))

    def _left(self, entry: ModelEntry) -> float | None:
        """Seconds until keep_alive unloads the model; None when it never does."""
        if entry.pinned:
            return None
        if entry.timer is not None:
            return entry.timer.when() - asyncio.get_running_loop().time()
        return entry.keep_alive if entry.keep_alive is not None else None


def _read_header(path: Path) -> tuple[ModelFacts, FimTexts]:
    facts = read_model_facts(path)
    return facts, fim_texts(facts)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""

