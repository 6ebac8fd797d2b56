"""One settings model: pydantic-settings turns it into the `serve` flags (its own CLI source), the
EDGE_LLM_* environment variables and the keys of the `--config` TOML file.

Precedence: command-line flags > environment variables > config file (TOML) > defaults.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from edge_llm.engine.llama.kv_types import KvCacheType, is_quantized
from edge_llm.engine.speculative.speculation import MAX_DRAFT_ROWS
from edge_llm.models.fetch import MODELS_DIR_ENV, default_model_path

logger = logging.getLogger(__name__)

ENV_PREFIX = "EDGE_LLM_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"  # the `config` setting's variable

# A list setting: a repeatable flag, a comma-separated environment variable, a TOML list or string.
CommaList = Annotated[list[str], NoDecode]


MIN_STREAM_CELLS = 256  # --deterministic: the smallest KV stream a sequence gets (llama.cpp's unit for a stream)


def logit_rows(*, parallel: int, cache_slots: int, batch_size: int, speculative: bool) -> int:
    """The most rows of logits llama.cpp's output buffer holds: it reserves one per sequence id, and grows to the
    largest step's rows with logits, every decoding sequence's token plus, with speculation, the draft rows a step
    verifies (MAX_DRAFT_ROWS at most). The engine writes that many once at load (engine/llama/runner.py), so the memory
    estimate counts them and the server's memory does not creep up to them while it serves."""
    decode_rows = min(batch_size, parallel + (MAX_DRAFT_ROWS if speculative else 0))
    return max(parallel + cache_slots, decode_rows)


def cores_available() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    config: Path | None = Field(
        None, description="TOML file of settings (keys are the flag names with underscores); read after the flags "
        "and the environment, which win over it."
    )

    # Model and engine
    model: Path = Field(
        default_factory=default_model_path,
        description=f"Path of the GGUF model file to serve: by default the model `edge-llm model fetch` downloads, "
        f"in ${MODELS_DIR_ENV}, else $XDG_DATA_HOME/edge-llm/models, else ~/.local/share/edge-llm/models.",
    )
    model_alias: str | None = Field(
        None, description="Extra name clients may use in the `model` field (besides the file name)."
    )

    # Many models (see README, Many models)
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
    memory_budget: str | None = Field(
        None, description="Memory the loaded models may take together, in bytes or with a unit (\"3GiB\", "
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
        description="Most sequences decoded together in one batch (8: see README, Performance).",
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
        "cached, runs beside it, or how its prompt is chunked, drafted or preempted (README, Deterministic mode). "
        "Each sequence gets its own KV stream of --ctx-size / (--parallel + --cache-slots) cells, the KV cache is "
        "quantized (q8_0 unless --cache-type-k/-v name another quantized type), flash attention is on, and "
        "ggml's repacked and tiled matrix kernels are off; --cache-reuse does not apply and --prefix-cache-dir "
        "is refused."
    )
    prefix_cache_dir: Path | None = Field(
        None, description="Directory where finished sequences' KV state is kept across restarts (the persistent "
        "prefix cache; off by default). See README, The persistent prefix cache."
    )
    prefix_cache_disk_budget: ByteSize = Field(
        ByteSize(1 << 30), description="Most bytes the persistent prefix cache keeps on disk (e.g. 512MiB, 2GB); "
        "least recently used entries are deleted beyond it."
    )
    prefix_cache_min_tokens: int = Field(
        256, ge=16, description="A finished sequence is saved to --prefix-cache-dir when it holds at least this many "
        "tokens that no saved entry already starts with."
    )
    prefix_cache_write_stall: float = Field(
        0.0, ge=0, description="TEST ONLY: seconds each prefix-cache save waits halfway through writing its "
        "temporary file (to test a kill during a save)."
    )

    # HTTP
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(3000, ge=0, le=65535, description="Port to bind.")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body accepted (bigger gets 413).")

    # Sampling defaults
    default_temperature: float = Field(0.7, ge=0.0, le=2.0, description="Temperature when a request gives none.")
    default_top_p: float = Field(0.9, gt=0.0, le=1.0, description="top_p when a request gives none.")
    default_top_k: int = Field(
        40, ge=0, le=1000,
        description="top_k when a request gives none; 0 turns it off. At temperature > 0 only the k likeliest "
        "tokens are sampled from: as in llama-server and Ollama, and without it top_p sorts the whole "
        "vocabulary for every token (about 1.6 ms a token here, over a tenth of an 8-sequence step).",
    )
    default_max_tokens: int = Field(128, ge=1, description="max_tokens when a request gives none.")

    # Security and exposure
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
        description="Browser origins allowed by CORS (comma list, e.g. http://localhost:5173; * allows any). "
        "CORS is off by default.",
    )

    # Limits
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

    # Operations
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
    test_hooks: bool = Field(
        False, description="TEST ONLY: enables POST /debug/kill-engine. Never enable it in production."
    )

    @field_validator("model", mode="before")
    @classmethod
    def _expand_model_path(cls, value: Any) -> Any:
        return Path(value).expanduser() if isinstance(value, (str, Path)) else value

    @field_validator("prefix_cache_dir", mode="before")
    @classmethod
    def _expand_cache_dir(cls, value: Any) -> Any:
        if value in ("", None):
            return None
        return Path(value).expanduser() if isinstance(value, (str, Path)) else value

    @field_validator("config", mode="before")
    @classmethod
    def _no_file_for_an_empty_name(cls, value: Any) -> Any:
        return value or None  # EDGE_LLM_CONFIG= (empty) names no file

    @field_validator("api_key", "allowed_hosts", "cors_origins", "pin", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            return [part.strip() for item in value for part in str(item).split(",") if part.strip()]
        return value

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _valid_keep_alive(cls, value: Any) -> Any:
        from edge_llm.registry.keep_alive import parse_keep_alive

        if value is None or value == "":
            return None
        parse_keep_alive(value)  # raises ValueError with the reason
        return str(value)

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _valid_memory_budget(cls, value: Any) -> Any:
        from edge_llm.registry.keep_alive import parse_bytes

        if value is None or value == "":
            return None
        parse_bytes(value)
        return str(value)

    @model_validator(mode="after")
    def _batch_holds_every_sequence(self) -> Settings:
        if self.batch_size < self.parallel:
            raise ValueError(f"batch_size ({self.batch_size}) must be at least parallel ({self.parallel})")
        return self

    @model_validator(mode="after")
    def _kv_settings_llama_cpp_accepts(self) -> Settings:
        if is_quantized(self.cache_type_v) and self.flash_attn == "off":
            raise ValueError(f"--cache-type-v {self.cache_type_v} needs flash attention: drop --flash-attn off, "
                             "or keep V in f16")
        if self.prefix_cache_dir is not None and self.cache_slots == 0:
            raise ValueError("--prefix-cache-dir needs the in-memory prefix cache: --cache-slots must be at least 1")
        return self

    @model_validator(mode="after")
    def _deterministic_kv_cache(self) -> Settings:
        """--deterministic needs a quantized KV cache (ggml-cpu's flash attention then computes each row alone, in
        the order of its sequence's cells), flash attention, and cells of --ctx-size split into a stream per
        sequence of at least MIN_STREAM_CELLS."""
        if not self.deterministic:
            return self
        for name in ("cache_type_k", "cache_type_v"):
            if name not in self.model_fields_set:
                setattr(self, name, "q8_0")
            elif not is_quantized(getattr(self, name)):
                raise ValueError(f"--deterministic needs a quantized KV cache: --{name.replace('_', '-')} "
                                 f"{getattr(self, name)} is not (leave it out for q8_0)")
        if self.flash_attn == "off":
            raise ValueError("--deterministic needs flash attention: drop --flash-attn off")
        if self.prefix_cache_dir is not None:
            # A prefix copied between KV streams is copied at the next decode; a state read or written before it
            # would see the stream as it was.
            raise ValueError("--prefix-cache-dir cannot be combined with --deterministic (yet)")
        if self.sequence_context < MIN_STREAM_CELLS:
            n_seq = self.parallel + self.cache_slots
            raise ValueError(f"--deterministic gives each of the {n_seq} sequences (--parallel {self.parallel} + "
                             f"--cache-slots {self.cache_slots}) its own {self.ctx_size // n_seq} cells of --ctx-size "
                             f"{self.ctx_size}, fewer than {MIN_STREAM_CELLS}: raise --ctx-size to at least "
                             f"{MIN_STREAM_CELLS * n_seq} or lower --parallel / --cache-slots")
        return self

    @property
    def stream_cells(self) -> int | None:
        """With --deterministic, the KV cells of each sequence's own stream (llama.cpp rounds a stream to 256 cells:
        rounded down here, so the streams together stay within --ctx-size); None with one shared stream."""
        if not self.deterministic:
            return None
        return self.ctx_size // (self.parallel + self.cache_slots) // 256 * 256

    @property
    def kv_cells(self) -> int:
        """The KV cells llama.cpp allocates: --ctx-size, or the streams' cells together with --deterministic."""
        cells = self.stream_cells
        return self.ctx_size if cells is None else cells * (self.parallel + self.cache_slots)

    @property
    def sequence_context(self) -> int:
        """The most tokens (prompt and answer) one sequence holds."""
        cells = self.stream_cells
        return self.ctx_size if cells is None else cells

    @property
    def model_name(self) -> str:
        return self.model.name.removesuffix(".gguf")

    @property
    def logit_rows(self) -> int:
        return logit_rows(parallel=self.parallel, cache_slots=self.cache_slots, batch_size=self.batch_size,
                          speculative=self.speculative == "ngram")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The CLI source, when there is one (settings_from_args), goes before all of these.
        return init_settings, _without_models_dir(env_settings), _ConfigFile(settings_cls)


def _without_models_dir(env_settings: PydanticBaseSettingsSource) -> Callable[[], dict[str, Any]]:
    """The environment, except that EDGE_LLM_MODELS_DIR keeps its older meaning, where `edge-llm model fetch` puts
    models and `serve` finds the default one: `--models-dir` (serve them all) is a flag or a TOML key only."""

    def source() -> dict[str, Any]:
        values = env_settings()
        values.pop("models_dir", None)
        return values

    return source


class _ConfigFile(PydanticBaseSettingsSource):
    """The TOML file that `config` names, as the flags, init arguments or environment gave it (the sources
    before this one: pydantic-settings hands their values over as `current_state`)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = self.current_state.get("config")
        if not path:
            return {}
        logger.debug("settings file: %s", path)
        return TomlConfigSettingsSource(self.settings_cls, toml_file=Path(path))()


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field (with its EDGE_LLM_* variable in the help), by pydantic-settings' CLI source;
    unset flags fall through to the environment, the file and the defaults."""
    source: CliSettingsSource[Settings] = CliSettingsSource(
        Settings, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True, cli_hide_none_type=True,
        cli_avoid_json=True, cli_show_env_vars=True,
    )
    parser.set_defaults(settings_source=source)  # settings_from_args reads the parsed flags through it
    for action in parser._actions:  # --models-dir has no variable (_without_models_dir): its help says none
        if "--models-dir" in action.option_strings and action.help:
            action.help = action.help.split(" [env:")[0]


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(_cli_settings_source=args.settings_source(parsed_args=args))
