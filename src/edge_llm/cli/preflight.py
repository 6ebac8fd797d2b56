"""Checks `edge-llm serve` makes before it loads anything, so that the mistakes people meet end with
one line saying what happened and what to do: the model file is missing (the line names where it
looked) or is not GGUF, the port is taken (or not allowed), the KV cache types do not fit the model's heads, the
prefix-cache directory cannot be written, or the context needs more memory than the machine has.
"""

from __future__ import annotations

import errno
import logging
import socket
from functools import lru_cache
from pathlib import Path

from edge_llm.config import Settings
from edge_llm.engine.llama.kv_types import head_size_problem
from edge_llm.models.gguf_info import GGUFInfoError, ModelFacts, read_model_facts
from edge_llm.models.gguf_report import human_bytes
from edge_llm.models.fetch import ModelFileError, check_model_file
from edge_llm.prompting.builtin_templates import chosen_template
from edge_llm.prompting.chat_template import TemplateError

logger = logging.getLogger("edge_llm.preflight")

_HEADROOM = 0.9  # leave a tenth of the available memory to everything else


def preflight(settings: Settings) -> str | None:
    """The first problem that would stop the server, as the line to show; None when all is well.
    Problems that only slow it down are logged as warnings."""
    problem = check_chat_template(settings)
    if problem is not None:
        return problem
    if settings.models_dir is not None:
        return check_models_dir(settings) or check_port(settings.host, settings.port)
    problem = check_model(settings.model) or check_port(settings.host, settings.port)
    if problem is not None:
        return problem
    problem = check_cache_dir(settings.prefix_cache_dir)
    if problem is not None:
        return problem
    facts = model_facts(settings.model)
    if facts is None:
        return None
    return check_kv_types(settings, facts) or check_memory(settings, facts)


def check_kv_types(settings: Settings, facts: ModelFacts) -> str | None:
    """llama.cpp refuses a quantized K or V type whose blocks do not divide the head size (it would return no
    context); said here in a line, before anything is loaded."""
    return (head_size_problem(settings.cache_type_k, facts.key_length, "k")
            or head_size_problem(settings.cache_type_v, facts.value_length, "v"))


def check_chat_template(settings: Settings) -> str | None:
    try:
        chosen_template(settings.chat_template, settings.chat_template_file)
    except TemplateError as exc:
        return str(exc)
    return None


def check_cache_dir(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"cannot write the prefix-cache directory {path}: {exc.strerror or exc}. Pick another --prefix-cache-dir"
    return None


def check_models_dir(settings: Settings) -> str | None:
    """--models-dir: the directory exists and every model in it (and --model, when given) is a usable GGUF file.
    Memory is not checked here: the registry loads models within the memory budget."""
    directory = settings.models_dir
    assert directory is not None
    if not directory.expanduser().is_dir():
        return f"--models-dir {directory} is not a directory"
    from edge_llm.registry.specs import served_paths

    try:
        paths = served_paths(settings)
    except OSError as exc:
        return f"cannot read --model or --models-dir: {exc}"
    if not paths:
        return (f"no GGUF model files (*.gguf) in {directory}: fetch one with `edge-llm model fetch NAME "
                f"--dir {directory}` or copy one there")
    for path in paths:
        problem = check_model(path)
        if problem is not None:
            return problem
    return None


def memory_budget() -> int | None:
    """The default --memory-budget: what the memory check allows one model, for all of them together."""
    available = available_memory()
    return None if available is None else int(available * _HEADROOM)


def check_model(path: Path) -> str | None:
    try:
        check_model_file(path)
    except ModelFileError as exc:
        return str(exc)
    return None


@lru_cache(maxsize=4)
def model_facts(path: Path) -> ModelFacts | None:
    """The model's header facts, or None when this reader cannot parse them (llama.cpp may still load it)."""
    try:
        return read_model_facts(path)
    except GGUFInfoError as exc:
        logger.debug("cannot read the GGUF header for the start-up checks: %s", exc)
        return None


def check_port(host: str, port: int) -> str | None:
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {host!r}: {exc.strerror}. Use --host 127.0.0.1 (this machine) or 0.0.0.0 (every interface)"
    family, kind, proto, _, address = infos[0]
    where = f"{host}:{port}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (f"port {port} is already in use on {host} (another edge-llm serve?). "
                        f"Stop that process, or pick a free port with --port, e.g. --port {port + 1}")
            if exc.errno == errno.EACCES:
                return f"not allowed to listen on {where}: ports below 1024 need privileges. Use --port 3000 or another above 1023"
            if exc.errno == errno.EADDRNOTAVAIL:
                return (f"{host} is not an address of this machine. Use --host 127.0.0.1 (this machine only) "
                        "or --host 0.0.0.0 (every interface)")
            return f"cannot listen on {where}: {exc.strerror or exc}"
    return None


def available_memory() -> int | None:
    """MemAvailable, lowered to what a cgroup (container) limit leaves; None where unknown."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit_text = Path(limit_file).read_text().strip()
            if limit_text == "max":
                continue
            room = int(limit_text) - int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if available is None or 0 <= room < available:
            available = max(room, 0)
    return available


def check_memory(settings: Settings, facts: ModelFacts, available: int | None = None) -> str | None:
    n_ubatch = min(settings.batch_size, 512)
    memory = facts.memory(settings.kv_cells, n_ubatch=n_ubatch, logit_rows=settings.logit_rows, cache_type_k=settings.cache_type_k,
                          cache_type_v=settings.cache_type_v)
    if facts.context_length and settings.ctx_size > facts.context_length:
        logger.warning("--ctx-size %d is more than the %d tokens %s was trained on: prompts stay limited to %d",
                       settings.ctx_size, facts.context_length, settings.model_name, facts.context_length)
    available = available if available is not None else available_memory()
    if available is None:
        return None
    budget = int(available * _HEADROOM)
    # allocated (the embedding context and the grammar texts on first use); the weights are mapped from the file
    buffers = memory.kv_cache_bytes + memory.compute_bytes + memory.embedding_bytes + memory.grammar_bytes
    if buffers > budget:
        hint = _context_that_fits(facts, budget - (buffers - memory.kv_cache_bytes) - memory.weights_bytes,
                                  facts.kv_bytes_per_token(settings.cache_type_k, settings.cache_type_v))
        what_to_do = f"Lower --ctx-size (about {hint:,} fits)" if hint else "Use a smaller model"
        if settings.cache_type_k == "f16" and settings.cache_type_v == "f16":
            what_to_do += ", use a quantized KV cache (--cache-type-k q8_0 --cache-type-v q8_0 halves it)"
        return (f"not enough memory for a context of {settings.ctx_size:,} tokens: the KV cache and buffers need "
                f"~{human_bytes(buffers)} plus {human_bytes(memory.weights_bytes)} of weights, and "
                f"{human_bytes(available)} is available. {what_to_do}, or free memory")
    if memory.total_bytes > budget:
        logger.warning(
            "the model and its buffers need ~%s and %s is available: expect slow answers while weights are paged "
            "in and out (a smaller --ctx-size or model avoids that)",
            human_bytes(memory.total_bytes), human_bytes(available),
        )
    return None


def _context_that_fits(facts: ModelFacts, room: int, per_token: int) -> int | None:
    if per_token <= 0 or room <= 0:
        return None
    tokens = room // per_token // 1024 * 1024
    if facts.context_length:
        tokens = min(tokens, facts.context_length)  # more than the trained context is of no use
    return tokens if tokens >= 256 else None
