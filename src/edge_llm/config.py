"""One settings model, composed of its areas (config_areas.py): pydantic-settings turns it into the `serve` flags
(its own CLI source), the EDGE_LLM_* environment variables and the keys of the `--config` TOML file.

Precedence: command-line flags > environment variables > config file (TOML) > defaults.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from edge_llm.config_areas import (
    ConfigFileArea,
    HttpArea,
    LimitsArea,
    ModelArea,
    OperationsArea,
    SamplingArea,
    SecurityArea,
)
from edge_llm.engine.llama.kv_types import is_quantized
from edge_llm.engine.speculative.speculation import MAX_DRAFT_ROWS

logger = logging.getLogger(__name__)

ENV_PREFIX = "EDGE_LLM_"
CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"  # the `config` setting's variable

MIN_STREAM_CELLS = 256  # --deterministic: the smallest KV stream a sequence gets (llama.cpp's unit for a stream)


def logit_rows(*, parallel: int, cache_slots: int, batch_size: int, speculative: bool) -> int:
    """The most rows of logits llama.cpp's output buffer holds: it reserves one per sequence id, and grows to the
    largest step's rows with logits, every decoding sequence's token plus, with speculation, the draft rows a step
    verifies (MAX_DRAFT_ROWS at most). The engine writes that many once at load (engine/llama/runner.py), so the memory
    estimate counts them and the server's memory does not creep up to them while it serves."""
    decode_rows = min(batch_size, parallel + (MAX_DRAFT_ROWS if speculative else 0))
    return max(parallel + cache_slots, decode_rows)


# Bases in reverse: pydantic lists the fields of the last base first.
class Settings(OperationsArea, LimitsArea, SecurityArea, SamplingArea, HttpArea, ModelArea, ConfigFileArea,
               BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

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

    @field_validator("model_alias", mode="before")
    @classmethod
    def _alias_list(cls, value: Any) -> Any:
        """llama-server's --alias a,b,c: the names, stripped, joined by commas (`alias_names` splits them)."""
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        if isinstance(value, str):
            return ",".join(name.strip() for name in value.split(",") if name.strip()) or None
        return value

    @field_validator("api_key", "allowed_hosts", "cors_origins", "pin", "tags", mode="before")
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
    def _no_budget_for_an_empty_value(cls, value: Any) -> Any:
        return None if value == "" else value  # EDGE_LLM_MEMORY_BUDGET= (empty): the default budget

    @model_validator(mode="after")
    def _batch_holds_every_sequence(self) -> Settings:
        if self.batch_size < self.parallel:
            raise ValueError(f"batch_size ({self.batch_size}) must be at least parallel ({self.parallel})")
        return self

    @model_validator(mode="after")
    def _one_chat_template(self) -> Settings:
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give --chat-template or --chat-template-file, not both")
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
    def alias_names(self) -> tuple[str, ...]:
        """--model-alias's names, in the order given."""
        return tuple(self.model_alias.split(",")) if self.model_alias else ()

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
