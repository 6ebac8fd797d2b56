"""`edge-llm model info` on the real default model (header only, no weights loaded) and on non-GGUF files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.testing.server import MODEL, environment, require_model


@pytest.fixture(autouse=True)
def model_present() -> None:
    require_model()  # not a skip: a missing model fails these tests with what to run


def model_info(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_llm", "model", "info", *args],
                          capture_output=True, text=True, timeout=60, env=environment(env))


def test_without_a_path_it_reads_the_default_model(tmp_path: Path) -> None:
    (tmp_path / DEFAULT_MODEL.filename).symlink_to(MODEL)
    result = model_info(env={"EDGE_LLM_MODELS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"file           {tmp_path / DEFAULT_MODEL.filename}"
    assert "architecture   qwen2" in result.stdout


def test_json_facts_of_the_default_model() -> None:
    result = model_info(str(MODEL), "--json", "--ctx", "8192")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    # Qwen2.5-Coder-0.5B-Instruct: qwen2, 24 blocks, 32k context, 151,936-token vocabulary, 14 heads / 2 KV heads.
    assert facts["architecture"] == "qwen2"
    assert facts["block_count"] == 24
    assert facts["context_length"] == 32768
    assert facts["vocab_size"] == 151936
    assert facts["embedding_length"] == 896
    assert (facts["head_count"], facts["head_count_kv"], facts["key_length"]) == (14, 2, 64)
    assert facts["has_chat_template"] is True
    assert facts["quantization"] == "Q4_K_M"
    assert facts["file_size"] == MODEL.stat().st_size == 491_400_064
    # Sum of tensor elements: 494M parameters plus the untied 151,936 × 896 output matrix.
    assert facts["parameter_count"] == 630_167_424
    assert sum(facts["tensor_types"].values()) == facts["parameter_count"]
    memory = facts["memory"]
    assert memory["n_ctx"] == 8192
    assert memory["kv_cache_bytes"] == 24 * 8192 * (2 * 64) * 2 * 2  # 96 MiB, as llama.cpp reports
    assert 450 * 2**20 < memory["weights_bytes"] < facts["file_size"]
    assert 250 * 2**20 < memory["compute_bytes"] < 400 * 2**20
    assert memory["embedding_bytes"] == 4096 * 24 * (2 * 64) * 2 * 2 + 4 * 32 * (2 * 151936 + 3 * 896)
    assert memory["grammar_bytes"] == 28 * 151936
    assert memory["total_bytes"] == (memory["weights_bytes"] + memory["kv_cache_bytes"] + memory["compute_bytes"]
                                     + memory["embedding_bytes"] + memory["grammar_bytes"])


def test_text_output_and_the_context_changes_the_kv_cache() -> None:
    result = model_info(str(MODEL), "--ctx", "32768")
    assert result.returncode == 0, result.stderr
    assert "architecture   qwen2" in result.stdout
    assert "Q4_K_M" in result.stdout
    assert "151,936 tokens" in result.stdout
    assert "chat template  yes" in result.stdout
    assert "KV cache 384.0 MiB" in result.stdout  # 4 × the 96 MiB at 8192


def test_a_file_that_is_not_gguf_is_one_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("this is not a model, just some text long enough to be read\n")
    result = model_info(str(text))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == f"edge-llm: error: not a GGUF file (bad magic bytes): {text}"

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(_head(MODEL, 4096))
    result = model_info(str(truncated))
    assert result.returncode == 1
    assert "truncated" in result.stderr and "Traceback" not in result.stderr

    result = model_info(str(tmp_path / "missing.gguf"))
    assert result.returncode == 1
    assert "file not found" in result.stderr


def _head(path: Path, n: int) -> bytes:
    with path.open("rb") as file:
        return file.read(n)
