"""The start-up banner of `edge-llm serve`: what is served, how, where to chat, and a curl to paste.

Logged once through `logging` (logger edge_llm.banner): several lines with `--log-format text`, one
line with the same facts as fields with `--log-format json`. Never shows an API key.
"""

from __future__ import annotations

import logging
import shlex

from edge_llm.config import Settings
from edge_llm.registry.keep_alive import describe_keep_alive
from edge_llm.registry.registry import ModelRegistry
from edge_llm.models.gguf_report import human_bytes, kv_types_label
from edge_llm.cli.preflight import model_facts

logger = logging.getLogger("edge_llm.banner")

_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


def local_url(host: str, port: int) -> str:
    """A URL a person on this machine can open: wildcard binds become loopback, IPv6 gets brackets."""
    if host in _WILDCARDS:
        host = "[::1]" if ":" in host else "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def curl_example(url: str, model: str, with_key: bool) -> str:
    body = ('{"model": "%s", "stream": true, "messages": [{"role": "user", "content": "Hello!"}]}' % model)
    key = ' -H "Authorization: Bearer $EDGE_LLM_API_KEY"' if with_key else ""
    return f"curl -N {url}/v1/chat/completions -H 'Content-Type: application/json'{key} -d {shlex.quote(body)}"


def context_line(settings: Settings) -> str:
    if settings.deterministic:
        return (f"{settings.sequence_context:,} tokens for each of {settings.parallel} parallel sequences and "
                f"{settings.cache_slots} cached ones (deterministic: a KV stream each)")
    return f"{settings.ctx_size:,} tokens shared by up to {settings.parallel} parallel sequences"


def log_banner(settings: Settings) -> None:
    facts = model_facts(settings.model)
    has_keys = bool(settings.api_key or settings.api_key_file)
    url = local_url(settings.host, settings.port)
    quantization = facts.quantization if facts else "unknown"
    memory = facts.memory(settings.kv_cells, n_ubatch=min(settings.batch_size, 512),
                          logit_rows=settings.logit_rows, cache_type_k=settings.cache_type_k,
                          cache_type_v=settings.cache_type_v) if facts else None
    kv_types = kv_types_label(settings.cache_type_k, settings.cache_type_v)
    fields = {
        "model": settings.model_name,
        "model_path": str(settings.model),
        "quantization": quantization,
        "ctx_size": settings.ctx_size,
        "sequence_context": settings.sequence_context,
        "deterministic": settings.deterministic,
        "threads": settings.threads,
        "parallel": settings.parallel,
        "memory_estimate_bytes": memory.total_bytes if memory else None,
        "kv_cache_bytes": memory.kv_cache_bytes if memory else None,
        "cache_type_k": settings.cache_type_k,
        "cache_type_v": settings.cache_type_v,
        "prefix_cache_dir": str(settings.prefix_cache_dir) if settings.prefix_cache_dir else None,
        "web_chat": url + "/",
        "curl": curl_example(url, settings.model_name, has_keys),
    }
    if settings.log_format == "json":
        logger.info("serving %s on %s (ctx %d, parallel %d, threads %d); loading the model; web chat at %s/",
                    settings.model_name, url, settings.ctx_size, settings.parallel, settings.threads, url,
                    extra=fields)
        return
    trained = f" (trained on {facts.context_length:,})" if facts and facts.context_length else ""
    memory_line = (f"~{human_bytes(memory.total_bytes)} = weights {human_bytes(memory.weights_bytes)} + "
                   f"KV cache {human_bytes(memory.kv_cache_bytes)} ({kv_types}) + "
                   f"compute ~{human_bytes(memory.compute_bytes)} + "
                   f"embeddings ~{human_bytes(memory.embedding_bytes)} + "
                   f"grammar texts ~{human_bytes(memory.grammar_bytes)}"
                   if memory else "unknown (the model header could not be read)")
    lines = [
        f"serving {settings.model_name} on {url}; loading the model",
        f"  model       {settings.model} ({quantization}"
        + (f", {facts.architecture}, {facts.parameter_count / 1e9:.2f} B parameters)" if facts else ")"),
        f"  context     {context_line(settings)}{trained}",
        f"  threads     {settings.threads} (prompt {settings.threads_batch or settings.threads})",
        f"  memory      {memory_line}",
    ]
    if settings.prefix_cache_dir is not None:
        lines.append(f"  disk cache  {settings.prefix_cache_dir} (up to {human_bytes(int(settings.prefix_cache_disk_budget))}"
                     f", entries of at least {settings.prefix_cache_min_tokens} new tokens)")
    lines += [
        f"  web chat    {url}/",
        f"  try it      {curl_example(url, settings.model_name, has_keys)}",
    ]
    if has_keys:
        lines.append("  (API keys are on: the web chat asks for one; /healthz and /readyz stay open)")
    logger.info("\n".join(lines))  # (text mode puts extra fields on the first line: the lines say it all)


def log_models_banner(settings: Settings, registry: ModelRegistry) -> None:
    """The banner of `--models-dir`: every model served, and the rules that load and unload them."""
    has_keys = bool(settings.api_key or settings.api_key_file)
    url = local_url(settings.host, settings.port)
    budget = human_bytes(registry.budget) if registry.budget is not None else "no limit"
    limit = f", at most {registry.max_loaded} loaded" if registry.max_loaded else ""
    rules = (f"memory budget {budget}{limit}; idle models {describe_keep_alive(registry.default_keep_alive)}; "
             f"the default model is {registry.default_model}")
    fields = {"models": [e.name for e in registry.entries], "models_dir": str(settings.models_dir),
              "memory_budget_bytes": registry.budget, "max_loaded_models": registry.max_loaded,
              "default_model": registry.default_model, "web_chat": url + "/"}
    if settings.log_format == "json":
        logger.info("serving %d models on %s, each loaded on its first request (%s)", len(registry.entries), url,
                    rules, extra=fields)
        return
    lines = [f"serving {len(registry.entries)} models on {url}, each loaded on its first request",
             f"  rules       {rules}"]
    for entry in registry.entries:
        spec = entry.spec
        aliases = f" (also {', '.join(spec.aliases)})" if spec.aliases else ""
        chat = "" if spec.has_chat_template else "; no chat template: completions only"
        pinned = "; pinned" if spec.pinned else ""
        lines.append(f"  model       {spec.name}{aliases}: ~{human_bytes(spec.memory_bytes)}{chat}{pinned}")
    lines += [f"  web chat    {url}/", f"  try it      {curl_example(url, registry.default_model, has_keys)}"]
    logger.info("\n".join(lines))
