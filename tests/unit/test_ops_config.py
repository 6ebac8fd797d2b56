"""Settings: flags > environment > config file > defaults, list settings, secrets kept out of repr."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edge_llm.cli.main import build_parser
from edge_llm.config import CONFIG_FILE_ENV, Settings, settings_from_args
from edge_llm.models.fetch import DEFAULT_MODEL, default_model_path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("EDGE_LLM_"):
            monkeypatch.delenv(name)


def settings(*argv: str) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "edge-llm.toml"
    config.write_text("port = 4001\nparallel = 3\nqueue_capacity = 7\ndrain_timeout = 12.5\nlog_format = \"text\"\n")
    monkeypatch.setenv("EDGE_LLM_PARALLEL", "5")
    monkeypatch.setenv("EDGE_LLM_QUEUE_CAPACITY", "9")
    result = settings("--config", str(config), "--queue-capacity", "11")
    assert result.queue_capacity == 11  # flag beats env and file
    assert result.parallel == 5  # env beats file
    assert result.port == 4001 and result.drain_timeout == 12.5 and result.log_format == "text"  # file beats default
    assert result.ctx_size == 8192  # default
    assert CONFIG_FILE_ENV not in os.environ  # the file reaches the settings without the environment


def test_the_flag_names_another_file_than_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "env.toml").write_text("port = 4001\n")
    (tmp_path / "flag.toml").write_text("port = 4002\n")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(tmp_path / "env.toml"))
    assert settings().port == 4001
    assert settings("--config", str(tmp_path / "flag.toml")).port == 4002
    monkeypatch.setenv(CONFIG_FILE_ENV, "")  # empty: no file
    assert settings().port == 3000 and settings().config is None


def test_config_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "edge-llm.toml"
    config.write_text("request_timeout = 90\nmax_tokens_cap = 256\n")
    monkeypatch.setenv(CONFIG_FILE_ENV, str(config))
    result = settings()
    assert result.request_timeout == 90 and result.max_tokens_cap == 256


def test_an_unknown_key_in_the_file_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "edge-llm.toml"
    config.write_text("no_such_setting = 1\n")
    with pytest.raises(Exception, match="no_such_setting"):
        settings("--config", str(config))


def test_list_settings_from_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings("--api-key", "a", "--api-key", "b,c").api_key == ["a", "b", "c"]
    monkeypatch.setenv("EDGE_LLM_API_KEY", " k1 , k2 ,")
    monkeypatch.setenv("EDGE_LLM_CORS_ORIGINS", "http://a.example,http://b.example")
    from_env = settings()
    assert from_env.api_key == ["k1", "k2"]
    assert from_env.cors_origins == ["http://a.example", "http://b.example"]
    config = tmp_path / "c.toml"
    config.write_text('allowed_hosts = ["x.example", "y.example"]\ncors_origins = "*"\n')
    monkeypatch.setenv(CONFIG_FILE_ENV, str(config))
    monkeypatch.delenv("EDGE_LLM_CORS_ORIGINS")  # the environment would win over the file
    from_file = settings()
    assert from_file.allowed_hosts == ["x.example", "y.example"] and from_file.cors_origins == ["*"]


def test_defaults_of_the_operations_settings() -> None:
    result = settings()
    assert result.api_key == [] and result.api_key_file is None
    assert result.allowed_hosts == [] and result.cors_origins == []
    assert result.log_format == "json" and result.log_prompts is False
    assert result.drain_timeout == 30 and result.request_timeout is None and result.stream_idle_timeout == 30
    assert result.max_prompt_tokens is None and result.max_tokens_cap is None


def test_the_default_model_lives_in_the_per_user_data_directory(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    home_default = tmp_path / "home" / ".local" / "share" / "edge-llm" / "models" / DEFAULT_MODEL.filename
    assert settings().model == default_model_path() == home_default
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # the XDG spec: a relative path is ignored
    assert settings().model == home_default
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert settings().model == tmp_path / "data" / "edge-llm" / "models" / DEFAULT_MODEL.filename
    monkeypatch.setenv("EDGE_LLM_MODELS_DIR", str(tmp_path / "mine"))
    assert settings().model == default_model_path() == tmp_path / "mine" / DEFAULT_MODEL.filename


def test_model_flag_and_environment_override_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_LLM_MODELS_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("EDGE_LLM_MODEL", "~/other.gguf")
    assert settings().model == Path.home() / "other.gguf"
    assert settings("--model", str(tmp_path / "flag.gguf")).model == tmp_path / "flag.gguf"


def test_api_keys_stay_out_of_repr() -> None:
    assert "secret-key" not in repr(settings("--api-key", "secret-key"))


def test_every_setting_is_a_flag_with_its_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])  # what `edge-llm serve --help` prints
    help_text = capsys.readouterr().out
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in help_text
        assert "EDGE_LLM_" + name.upper() in help_text.replace("\n", "").replace(" ", "")


def test_deterministic_mode_takes_a_quantized_kv_cache_and_a_stream_per_sequence(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    plain = settings()
    assert (plain.stream_cells, plain.kv_cells, plain.sequence_context) == (None, 8192, 8192)
    det = settings("--deterministic", "--parallel", "4", "--cache-slots", "2", "--ctx-size", "10000")
    assert det.cache_type_k == det.cache_type_v == "q8_0"  # unless another quantized type is named
    assert det.stream_cells == det.sequence_context == 1536  # 10000 / 6 = 1666, down to llama.cpp's unit of 256
    assert det.kv_cells == 6 * 1536  # within --ctx-size, which the memory estimate counts
    monkeypatch.setenv("EDGE_LLM_CACHE_TYPE_V", "q4_0")
    assert settings("--deterministic").cache_type_v == "q4_0"
    for argv, message in ((["--cache-type-k", "f16"], "needs a quantized KV cache: --cache-type-k f16"),
                          (["--flash-attn", "off"], "needs flash attention"),
                          (["--ctx-size", "2048"], "raise --ctx-size to at least 4096"),  # 16 sequences of 128
                          (["--prefix-cache-dir", str(tmp_path)], "--prefix-cache-dir cannot be combined")):
        with pytest.raises(ValueError, match=re.escape(message)):
            settings("--deterministic", *argv)
