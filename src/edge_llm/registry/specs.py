"""What a server serves: one `ModelSpec` per GGUF file (--model, every file of --models-dir), with its names
(file name, catalogue name, aliases) and memory estimate, read from the GGUF header before anything loads."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_llm.config import Settings
from edge_llm.models.catalogue import catalogue_name_of, ollama_name_of
from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.models.gguf_info import GGUFInfoError, read_model_facts
from edge_llm.registry.names import NameIndex, NameTaken

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the model id: the file name without .gguf
    path: Path
    aliases: tuple[str, ...] = ()  # other names a request may use besides the id, the file name and ollama_name
    memory_bytes: int = 0  # weights + KV cache + compute + embeddings at the server's context (gguf_info estimate)
    pinned: bool = False  # --pin: never unloaded for idleness nor evicted
    facts: dict[str, Any] = field(default_factory=dict, compare=False)  # for /v1/models
    ollama_name: str = ""  # its name in Ollama's API (/api/tags): `gemma3:270m`, else `<id>:latest`
    tags: tuple[str, ...] = ()  # --tags: labels shown in /v1/models, not names

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.name, self.path.name, *filter(None, (self.ollama_name,)), *self.aliases)))

    @property
    def has_chat_template(self) -> bool:
        return bool(self.facts.get("chat_template", True))


class ModelSpecError(ValueError):
    """The settings name models that cannot be served (one line for the user)."""


def served_paths(settings: Settings) -> list[Path]:
    """--model, and every *.gguf of --models-dir (sorted by name); --model first when it was given."""
    explicit_model = "model" in settings.model_fields_set or settings.models_dir is None
    paths = [settings.model.absolute()] if explicit_model else []
    if settings.models_dir is not None:
        found = sorted(p.absolute() for p in settings.models_dir.expanduser().glob("*.gguf") if p.is_file())
        paths += [p for p in found if all(not p.samefile(q) for q in paths)]
    return paths


def default_model_name(settings: Settings, specs: list[ModelSpec]) -> str:
    """The model of a request that names none: --model when given, else the default model when the directory has
    it, else the first by name."""
    if "model" in settings.model_fields_set or settings.models_dir is None:
        return specs[0].name
    return next((s.name for s in specs if s.path.name == DEFAULT_MODEL.filename), specs[0].name)


def model_specs(settings: Settings) -> list[ModelSpec]:
    """The served models, the default one (`default_model_name`) first: --model's aliases (--model-alias) go to it."""
    paths = served_paths(settings)
    if not paths:
        raise ModelSpecError(f"no GGUF model files (*.gguf) in {settings.models_dir}: fetch one with "
                             f"`edge-llm model fetch NAME --dir {settings.models_dir}` or copy one there")
    specs = [spec_for_path(settings, path) for path in paths]
    default = default_model_name(settings, specs)
    specs.sort(key=lambda spec: spec.name != default)  # stable: the others keep their order
    extra = tuple(name for name in settings.alias_names if name not in specs[0].names)
    specs[0] = _replace(specs[0], aliases=specs[0].aliases + extra, tags=tuple(settings.tags))
    taken: NameIndex[str] = NameIndex()
    for spec in specs:
        for own in spec.names:
            try:
                taken.add(own, spec.name)
            except NameTaken as exc:
                raise ModelSpecError(f"two models are called {own!r}: {exc.owner} and {spec.name}; rename one") from None
    specs = _with_configured_aliases(settings, specs, taken)
    pinned = set(settings.pin)
    unknown = {name for name in pinned if taken.owner(name) is None}
    if unknown:
        raise ModelSpecError(f"--pin names no served model: {', '.join(sorted(unknown))}")
    pinned_ids = {taken.owner(name) for name in pinned}
    return [_replace(s, pinned=s.name in pinned_ids) for s in specs]


def spec_for_path(settings: Settings, path: Path) -> ModelSpec:
    """A served model file's spec: its id (the file name without .gguf), catalogue and Ollama names, and the
    memory it needs at the server's context, from its header."""
    name = path.name.removesuffix(".gguf")
    aliases = tuple(a for a in (catalogue_name_of(path.name),) if a and a != name)
    memory, pinned, facts = _estimate(settings, path)
    return ModelSpec(name, path, aliases, memory, pinned, facts, ollama_name=ollama_name_of(path.name))


def _with_configured_aliases(settings: Settings, specs: list[ModelSpec], taken: NameIndex[str]) -> list[ModelSpec]:
    extra: dict[str, list[str]] = {}
    for alias, target in settings.model_aliases.items():
        owner = taken.owner(target)
        if owner is None:
            raise ModelSpecError(f"model_aliases: {alias!r} → {target!r}, which is not a served model "
                                 f"(served: {', '.join(s.name for s in specs)})")
        try:
            taken.add(alias, owner)
        except NameTaken as exc:
            raise ModelSpecError(f"model_aliases: {alias!r} is already the name of {exc.owner}") from None
        extra.setdefault(owner, []).append(alias)
    return [_replace(s, aliases=s.aliases + tuple(a for a in extra.get(s.name, ()) if a not in s.names))
            for s in specs]


def _replace(spec: ModelSpec, **changes: Any) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, **changes)


def _estimate(settings: Settings, path: Path) -> tuple[int, bool, dict[str, Any]]:
    """(memory estimate, pinned (set later), header facts) for a model file; the file size when the header is
    unreadable here (llama.cpp may still load it)."""
    try:
        facts = read_model_facts(path)
    except (GGUFInfoError, OSError) as exc:
        logger.warning("cannot read the GGUF header of %s (%s): its memory is estimated by its size", path, exc)
        size = path.stat().st_size if path.exists() else 0
        return size, False, {"size": size}
    memory = facts.memory(settings.kv_cells, n_ubatch=min(settings.batch_size, 512),
                          logit_rows=settings.logit_rows)
    return memory.total_bytes, False, {
        "architecture": facts.architecture,
        "n_params": facts.parameter_count,
        "quantization": facts.quantization,
        "n_ctx_train": facts.context_length,
        "size": facts.file_size,
        "chat_template": facts.has_chat_template,
        "memory_estimate": memory.total_bytes,
        "description": facts.name,
    }
