"""Start-up checks (model file, port, memory) and the banner's pieces, without a model or a server."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from edge_llm.cli.banner import curl_example, local_url
from edge_llm.config import Settings
from edge_llm.models.gguf_info import ModelFacts
from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.cli.preflight import check_memory, check_model, check_port, preflight

GIB = 1 << 30


def facts(**overrides: object) -> ModelFacts:
    values: dict = dict(
        path=Path("m.gguf"), file_size=500 << 20, gguf_version=3, architecture="qwen2", name=None,
        parameter_count=630_000_000, tensor_count=291, tensor_data_bytes=463 << 20, file_type="Q4_K_M",
        tensor_types={"Q5_0": 1}, context_length=32768, block_count=24, embedding_length=896, head_count=14,
        head_count_kv=2, key_length=64, value_length=64, vocab_size=151936, has_chat_template=True,
    )
    values.update(overrides)
    return ModelFacts(**values)


def settings(**values: object) -> Settings:
    return Settings(model=Path("m.gguf"), threads=2, **values)


def test_a_missing_default_model_names_where_it_looked_and_how_to_fetch_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGE_LLM_MODEL", raising=False)
    monkeypatch.setenv("EDGE_LLM_MODELS_DIR", str(tmp_path))
    expected = (f"model file not found: {tmp_path / DEFAULT_MODEL.filename} (the default model; run "
                "`edge-llm model fetch` to download it there, or pass --model PATH)")
    assert preflight(Settings(threads=2, port=0)) == expected


def test_a_missing_model_given_by_path_is_named_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGE_LLM_MODELS_DIR", str(tmp_path / "store"))
    message = check_model(Path("sub/missing.gguf"))
    assert message == (f"model file not found: {tmp_path / 'sub' / 'missing.gguf'} (from --model, EDGE_LLM_MODEL "
                       f"or the config file; `edge-llm model fetch` downloads the default model to "
                       f"{tmp_path / 'store' / DEFAULT_MODEL.filename})")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "missing.gguf").write_bytes(b"not a gguf file, but long enough to be read")
    assert check_model(Path("sub/missing.gguf")) == "not a GGUF model file (bad magic bytes): sub/missing.gguf"


def test_a_taken_port_is_named_with_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = check_port("127.0.0.1", port)
    assert message is not None
    assert f"port {port} is already in use" in message and "--port" in message
    assert check_port("127.0.0.1", port) is None  # free again
    assert check_port("127.0.0.1", 0) is None


def test_an_address_of_another_machine_is_explained() -> None:
    message = check_port("192.0.2.1", 3000)  # TEST-NET-1: never local (nothing is sent, bind only)
    assert message is not None and "--host 127.0.0.1" in message


def test_memory_for_the_context() -> None:
    model = facts()
    assert check_memory(settings(ctx_size=8192), model, available=20 * GIB) is None
    message = check_memory(settings(ctx_size=4_000_000), model, available=20 * GIB)
    assert message is not None
    assert message.startswith("not enough memory for a context of 4,000,000 tokens")
    assert "Lower --ctx-size (about 32,768 fits)" in message  # capped at the trained context
    tight = check_memory(settings(ctx_size=262_144), model, available=2 * GIB)
    assert tight is not None and "Lower --ctx-size (about" in tight
    assert check_memory(settings(ctx_size=8192), model, available=100 << 20) is not None


def test_warnings_for_a_context_past_training_and_for_paging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edge_llm.cli.preflight"):
        assert check_memory(settings(ctx_size=65536), facts(), available=20 * GIB) is None
        assert check_memory(settings(ctx_size=8192), facts(tensor_data_bytes=8 * GIB), available=8 * GIB) is None
    text = caplog.text
    assert "more than the 32768 tokens" in text
    assert "expect slow answers" in text


def test_banner_urls_and_curl() -> None:
    assert local_url("0.0.0.0", 3000) == "http://127.0.0.1:3000"
    assert local_url("::", 3000) == "http://[::1]:3000"
    assert local_url("::1", 8080) == "http://[::1]:8080"
    assert local_url("192.168.1.5", 80) == "http://192.168.1.5:80"
    assert "Authorization: Bearer $EDGE_LLM_API_KEY" in curl_example("http://127.0.0.1:3000", "m", True)
    assert "Authorization" not in curl_example("http://127.0.0.1:3000", "m", False)
