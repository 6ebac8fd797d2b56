"""KV cache types: the memory estimate for each, the start-up checks and the settings rules, without a model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_llm.cli.preflight import check_kv_types, check_memory
from edge_llm.config import Settings
from edge_llm.engine.llama.kv_types import KV_TYPES, head_size_problem, row_bytes
from edge_llm.models.gguf_report import describe

from tests.unit.test_preflight import GIB, facts, settings

# Qwen2.5-Coder-0.5B: 24 layers, 2 KV heads of 64 values: 128 values of K and 128 of V per layer and token.
VALUES = 24 * 128


@pytest.mark.parametrize(("kv_type", "bytes_per_value"), [
    ("f32", 4), ("f16", 2), ("bf16", 2), ("q8_0", 34 / 32), ("q5_1", 24 / 32), ("q5_0", 22 / 32), ("q4_1", 20 / 32),
    ("q4_0", 18 / 32), ("iq4_nl", 18 / 32),
])
def test_the_estimate_for_each_type(kv_type: str, bytes_per_value: float) -> None:
    model = facts()
    per_token = model.kv_bytes_per_token(kv_type, kv_type)
    assert per_token == round(2 * VALUES * bytes_per_value)
    memory = model.memory(8192, logit_rows=16, cache_type_k=kv_type, cache_type_v=kv_type)
    assert memory.kv_cache_bytes == 8192 * per_token
    assert (memory.cache_type_k, memory.cache_type_v) == (kv_type, kv_type)
    # the embeddings context keeps f16 whatever the serving context uses
    assert memory.embedding_bytes == model.memory(8192, logit_rows=16).embedding_bytes


def test_f16_q8_0_and_q4_0_at_the_default_context() -> None:
    model = facts()
    kv = {t: model.memory(8192, logit_rows=16, cache_type_k=t, cache_type_v=t).kv_cache_bytes for t in ("f16", "q8_0", "q4_0")}
    assert kv["f16"] == 96 << 20  # what llama.cpp reports for this model at 8,192 cells
    assert kv["q8_0"] == 51 << 20
    assert kv["q4_0"] == 27 << 20
    mixed = model.memory(8192, logit_rows=16, cache_type_k="q8_0", cache_type_v="f16").kv_cache_bytes
    assert mixed == (kv["q8_0"] + kv["f16"]) // 2


def test_model_info_names_the_types() -> None:
    lines = list(describe(facts(), 8192, logit_rows=16, cache_type_k="q8_0", cache_type_v="q8_0"))
    memory = next(line for line in lines if line.startswith("memory"))
    assert "KV cache 51.0 MiB (q8_0)" in memory
    mixed = next(line for line in describe(facts(), 8192, logit_rows=16, cache_type_k="q4_0") if line.startswith("memory"))
    assert "(K q4_0, V f16)" in mixed


def test_row_sizes_are_ggml_row_sizes() -> None:
    assert row_bytes("q8_0", 128) == 4 * 34
    assert row_bytes("f16", 128) == 256
    assert set(KV_TYPES) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def test_a_quantized_type_needs_a_head_size_its_blocks_divide() -> None:
    assert head_size_problem("q8_0", 64, "k") is None
    assert head_size_problem("f16", 80, "k") is None
    problem = head_size_problem("q4_0", 80, "v")
    assert problem is not None and "--cache-type-v q4_0" in problem and "80" in problem
    assert check_kv_types(settings(cache_type_k="q8_0"), facts(key_length=80)) is not None
    assert check_kv_types(settings(cache_type_k="q8_0", cache_type_v="q4_0"), facts()) is None


def test_the_memory_check_counts_the_types_and_suggests_them() -> None:
    model = facts()
    # at 600,000 cells f16 needs ~6.9 GiB of KV, q4_0 ~1.9 GiB
    assert check_memory(settings(ctx_size=600_000), model, available=4 * GIB) is not None
    assert check_memory(settings(ctx_size=600_000, cache_type_k="q4_0", cache_type_v="q4_0"), model,
                        available=4 * GIB) is None
    message = check_memory(settings(ctx_size=600_000), model, available=4 * GIB)
    assert message is not None and "--cache-type-k q8_0 --cache-type-v q8_0" in message


def test_a_quantized_v_without_flash_attention_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs flash attention"):
        Settings(model=Path("m.gguf"), cache_type_v="q8_0", flash_attn="off")
    assert Settings(model=Path("m.gguf"), cache_type_k="q8_0", flash_attn="off").cache_type_k == "q8_0"
    with pytest.raises(ValidationError):
        Settings(model=Path("m.gguf"), cache_type_k="q3_k")  # not a type llama.cpp keeps a KV cache in
