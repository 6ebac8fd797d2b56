"""The settings by area, each a part of `config.Settings` (which composes them, checks them together and reads them
from flags, environment and file): the model and engine, HTTP, sampling defaults, security and exposure, request
limits, operations. Field order here is the order of `edge-llm serve --help`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ByteSize, Field
from pydantic_settings import NoDecode

from edge_llm.engine.llama.kv_types import KvCacheType
from edge_llm.models.fetch import MODELS_DIR_ENV, default_model_path

# A list setting: a repeatable flag, a comma-separated environment variable, a TOML list or string.
CommaList = Annotated[list[str], NoDecode]


def cores_available() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class ConfigFileArea(BaseModel):
    config: Path | None = Field(
        None, description="TOML file of settings (keys are the flag names with underscores); read after the flags "
        "and the environment, which win over it."
    )


class ModelArea(BaseModel):
    """The model and its engine; many models (docs: Models)."""

    model: Path = Field(
        default_factory=default_model_path,
        description=f"Path of the GGUF model file to serve: by default the model `edge-llm model fetch` downloads, "
        f"in ${MODELS_DIR_ENV}, else $XDG_DATA_HOME/edge-llm/models, else ~/.local/share/edge-llm/models.",
    )
    model_alias: str | None = Field(
        None, description="Extra names clients may use in the `model` field (besides the file name), comma-"
        "separated as llama-server's --alias: the first is the model's name in /props and llama-server's routes."
    )
    tags: CommaList = Field(
        [], description="Labels of --model's model, shown in /v1/models (`tags`), as llama-server's --tags "
        "(comma list; informational, not names a request may use)."
    )

    chat_template: str | None = Field(
        None, description="Chat template of --model's model instead of the GGUF's, as llama-server's "
        "--chat-template: a built-in name (chatml, gemma, llama2, llama3, mistral-v7, phi3, zephyr) or a Jinja "
        "template, rendered in the same sandbox; one that does not render stops start-up."
    )
    chat_template_file: Path | None = Field(
        None, description="The same, read from a Jinja file (as llama-server's --chat-template-file)."
    )

    # Many models (docs/models.md#many-models-in-one-server)
    models_dir: Path | None = Field(
        None, description="Serve every GGUF file in this directory, each loaded on its first request and unloaded "
        f"when idle (with --model too: that one is also served, and is the default for requests naming none). A flag "
        f"or TOML key only: ${MODELS_DIR_ENV} is where `edge-llm model fetch` puts models."
    )
    model_aliases: dict[str, str] = Field(
        {}, description="Extra names for models, alias → model name (a TOML table [model_aliases], or "
        "--model-aliases '{\"coder\": \"qwen2.5-coder-0.5b-instruct-q4_k_m\"}')."
    )
    keep_alive: str | None = Field(
        None, description="How long a model stays loaded after its last request, as Ollama's keep_alive: a "
        "duration (\"5m\", \"90s\", \"1h\", seconds as a number), 0 (unload after each request) or -1 (never "
        "unload). Default: -1 with --model alone, 5m with --models-dir. A request's keep_alive field wins."
    )
    pin: CommaList = Field(
        [], description="Models never unloaded for idleness nor evicted for room (comma list of names)."
    )
    max_loaded_models: int | None = Field(
        None, ge=1, description="Most models loaded at once; loading one more unloads the least recently used "
        "idle one (default: no limit but the memory budget)."
    )
    memory_budget: ByteSize | None = Field(
        None, gt=0, description="Memory the loaded models may take together, in bytes or with a unit (\"3GiB\", "
        "\"1500MB\"), each model counted by its memory estimate (edge-llm model info). Default: 90% of the memory "
        "available at start-up, as the start-up memory check computes it."
    )
    load_wait_timeout: float = Field(
        30.0, ge=0, description="Seconds a request for an unloaded model waits for memory held by busy models "
        "before it gets 503 model_memory_busy (with Retry-After)."
    )
    threads: int = Field(default_factory=cores_available, ge=1, description="CPU threads for decoding.")
    threads_batch: int | None = Field(
        None, ge=1, description="CPU threads for prompt processing (None: the same as --threads)."
    )
    grammar_step_budget_ms: int = Field(
        1000, ge=10, description="Most milliseconds one step may spend checking one sequence's grammar against the "
        "vocabulary; a request whose grammar takes longer ends with an error (grammar_too_costly) instead of "
        "stalling the other sequences."
    )
    ctx_size: int = Field(
        8192, ge=256, description="Total KV-cache size in tokens, shared by all running sequences and the prefix cache."
    )
    batch_size: int = Field(
        512, ge=16, description="Most tokens one decode step carries; long prompts are prefilled in chunks of this size."
    )
    parallel: int = Field(
        8, ge=1, le=64,
        description="Most sequences decoded together in one batch (8: see docs/performance.md).",
    )
    cache_slots: int = Field(
        8, ge=0, le=128, description="Finished sequences kept in the KV cache for prefix reuse (0 disables the prefix cache)."
    )
    speculative: Literal["off", "ngram"] = Field(
        "ngram", description="Speculative decoding: `ngram` drafts a request's next tokens from its own prompt and "
        "output (prompt lookup) and verifies them in the same batch, as many as pay; answers are those of `off` "
        "(greedy: up to rounding; sampled: the same distribution). 1.9-2.2x on code edits and within a few percent "
        "of off on prose and free JSON; `off` drafts nothing."
    )
    queue_capacity: int = Field(
        32, ge=1, description="Most requests waiting for a free sequence; more get 503 with Retry-After."
    )
    cache_type_k: KvCacheType = Field(
        "f16", description="Data type of the KV cache's keys: f16, or q8_0 (about half of f16's memory), q4_0 (about "
        "a quarter), q4_1, q5_0, q5_1, iq4_nl, bf16, f32, as llama-server's -ctk."
    )
    cache_type_v: KvCacheType = Field(
        "f16", description="Data type of the KV cache's values (as --cache-type-k; a quantized type needs flash "
        "attention), as llama-server's -ctv."
    )
    flash_attn: Literal["auto", "on", "off"] = Field(
        "auto", description="Flash attention: auto (llama.cpp turns it on where the backend supports it: on CPU "
        "always, and always for a quantized V cache), on, or off (then --cache-type-v must not be quantized)."
    )
    deterministic: bool = Field(
        False, description="Repeatable answers: a temperature-0 or seeded request gives the same bytes whatever is "
        "cached, runs beside it, or how its prompt is chunked, drafted or preempted (docs/determinism.md). "
        "Each sequence gets its own KV stream of --ctx-size / (--parallel + --cache-slots) cells, the KV cache is "
        "quantized (q8_0 unless --cache-type-k/-v name another quantized type), flash attention is on, and "
        "ggml's repacked and tiled matrix kernels are off; --cache-reuse does not apply and --prefix-cache-dir "
        "is refused."
    )
    prefix_cache_dir: Path | None = Field(
        None, description="Directory where finished sequences' KV state is kept across restarts (the persistent "
        "prefix cache; off by default). See docs/kv-cache.md#the-persistent-prefix-cache."
    )
    prefix_cache_disk_budget: ByteSize = Field(
        ByteSize(1 << 30), description="Most bytes the persistent prefix cache keeps on disk (e.g. 512MiB, 2GB); "
        "least recently used entries are deleted beyond it."
    )
    prefix_cache_min_tokens: int = Field(
        256, ge=16, description="A finished sequence is saved to --prefix-cache-dir when it holds at least this many "
        "tokens that no saved entry already starts with."
    )


class HttpArea(BaseModel):
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(3000, ge=0, le=65535, description="Port to bind.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body accepted (bigger gets 413).")
    responses_store_entries: int = Field(
        1000, ge=0, description="Responses kept (in memory, least recently used dropped first) for "
        "previous_response_id and GET /v1/responses/{id}; 0 keeps none.")
    responses_store_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="The most bytes (their JSON) the kept responses may hold together.")


class SamplingArea(BaseModel):
    """Sampling defaults, for requests that give none."""

    default_temperature: float = Field(0.7, ge=0.0, le=2.0, description="Temperature when a request gives none.")
    default_top_p: float = Field(0.9, gt=0.0, le=1.0, description="top_p when a request gives none.")
    default_top_k: int = Field(
        40, ge=0, le=1000,
        description="top_k when a request gives none; 0 turns it off. At temperature > 0 only the k likeliest "
        "tokens are sampled from: as in llama-server and Ollama, and without it top_p sorts the whole "
        "vocabulary for every token (about 1.6 ms a token here, over a tenth of an 8-sequence step).",
    )
    default_max_tokens: int = Field(128, ge=1, description="max_tokens when a request gives none.")
    seed: int = Field(
        -1, ge=-1, le=2**32 - 1, description="Seed of sampled requests that give none, as llama-server's --seed: "
        "then two identical requests give the same text (with --deterministic, whatever runs beside them); "
        "-1: a random seed for each request."
    )


class SecurityArea(BaseModel):
    """Security and exposure."""

    api_key: CommaList = Field(
        [],
        repr=False,
        description="API key clients must send as `Authorization: Bearer KEY` (repeatable; the environment "
        "variable takes a comma-separated list). Off when no key is set; /healthz and /readyz stay open.",
    )
    api_key_file: Path | None = Field(
        None, description="File of API keys, one a line (blank lines and # comments ignored)."
    )
    allowed_hosts: CommaList = Field(
        [],
        description="Extra Host header names accepted (comma list; * accepts any). Always accepted: localhost, "
        "127.0.0.1, [::1], the bound address and this machine's name.",
    )
    cors_origins: CommaList = Field(
        [],
        description="Browser origins allowed by CORS (comma list, e.g. http://localhost:5173; * allows any; the "
        "keyword localhost allows http(s)://localhost, 127.0.0.1 and [::1] at any port, as llama-server's). "
        "CORS is off by default.",
    )


class LimitsArea(BaseModel):
    """Limits on requests and connections."""

    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Largest prompt in tokens (longer gets 400 context_length_exceeded; default: the context)."
    )
    max_tokens_cap: int | None = Field(
        None, ge=1, description="Most tokens one request may generate; larger max_tokens are capped (finish_reason length)."
    )
    request_timeout: float | None = Field(
        None, gt=0, description="Seconds after which a generation ends with its partial output and "
        "finish_reason \"timeout\" (default: no deadline)."
    )
    stream_idle_timeout: float = Field(
        30.0, ge=0, description="Seconds a client may leave a response unread before it is disconnected and "
        "its sequence freed (0 disables)."
    )
    cache_reuse: int = Field(
        64, ge=0, description="Fill-in-the-middle requests (/infill, completions with a suffix) may take over the "
        "previous completion's cached prompt and move a chunk of at least N tokens that reappears after the edit "
        "(the rest of the file) to its new positions instead of computing it again, as llama-server's "
        "--cache-reuse; the moved keys are re-rotated but keep what preceded them before the edit, an "
        "approximation editors accept for speed (0 = off)."
    )
    pooling: Literal["auto", "mean", "last", "cls"] = Field(
        "auto", description="How /v1/embeddings pools a text's per-token hidden states into one vector: the "
        "average (mean), the last token's (last) or the first token's (cls); auto takes the pooling the GGUF "
        "declares (embedding models do), else mean."
    )
    strict_params: bool = Field(
        False, description="Refuse unknown request fields with a 400 instead of ignoring them (they are named in "
        "the X-Edge-LLM-Ignored-Fields response header)."
    )
    sse_keepalive: float = Field(
        15.0, ge=0, description="Seconds a stream may send nothing (queued, prefilling) before it gets an SSE "
        "`: keep-alive` comment, so proxies that cut idle connections keep it open (0 disables)."
    )
    max_header_bytes: int = Field(
        16384, ge=1024, description="Most bytes of request headers; more get 431."
    )
    max_headers: int = Field(100, ge=8, description="Most request headers; more get 431.")
    head_timeout: float = Field(
        30.0, ge=0, description="Seconds a connection gets to send a whole request head (from its opening, or from "
        "the request's first byte on a kept-alive connection); then a 408 and the connection is closed (0: none)."
    )
    body_timeout: float = Field(
        30.0, ge=0, description="Seconds without a byte while a request body is incomplete; then the connection "
        "is closed and the request logged as 499 (0: none)."
    )
    max_connections: int | None = Field(
        None, ge=1, description="Most open client connections; more get a 503 with Retry-After and are closed. "
        "Default and ceiling: the open-file limit (ulimit -n) less 128 descriptors kept for the server itself."
    )


class OperationsArea(BaseModel):
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Logging level.")
    log_format: Literal["json", "text"] = Field("json", description="Log lines as JSON objects or as text.")
    log_prompts: bool = Field(
        False, description="Put prompts and outputs into the access log lines (off: they are never logged)."
    )
    watchdog_seconds: float = Field(
        60.0, ge=0, description="A decode step of the engine thread, or a tokenize/template/grammar job of the "
        "tokenizer thread, running longer than this is reported: a warning naming its requests, "
        "edge_llm_watchdog_stalls_total, and /readyz 503 \"degraded\" (/healthz says so too) until it ends (0: off)."
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="On SIGTERM/SIGINT, seconds running requests get to finish before they are cancelled."
    )
