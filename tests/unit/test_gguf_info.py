"""gguf_info on small GGUF files written with the gguf package's own writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, LlamaFileType

from edge_llm.api.serving.ollama_describe import template
from edge_llm.config import logit_rows
from edge_llm.engine.speculative.speculation import MAX_DRAFT_ROWS
from edge_llm.models.gguf_info import GGUFInfoError, read_model_facts
from edge_llm.models.gguf_report import describe
from edge_llm.models.gguf_tokens import fim_texts


def write_model(path: Path, *, template: str | None = "{{ messages }}", vocab: int = 100) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}".encode() for i in range(vocab)])
    writer.add_token_types([1] * vocab)
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 64), dtype=np.float16))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_facts_from_the_header(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_model(path)
    facts = read_model_facts(path)
    assert facts.architecture == "llama"
    assert facts.block_count == 2 and facts.context_length == 4096
    assert facts.vocab_size == 100  # from the token list's length
    assert facts.parameter_count == 100 * 64 + 64
    assert facts.tensor_types == {"F16": 6400, "F32": 64}
    assert facts.file_type == "F16" and facts.quantization == "F16"
    assert facts.tensor_data_bytes == 6400 * 2 + 64 * 4
    assert facts.has_chat_template
    assert (facts.head_count, facts.head_count_kv, facts.key_length, facts.value_length) == (8, 2, 8, 8)
    memory = facts.memory(1000, n_ubatch=10, logit_rows=3)
    assert memory.kv_cache_bytes == 2 * 1000 * (2 * 8) * 2 * 2  # n_layer × n_ctx × (n_head_kv × head_dim) × 2 × 2
    assert memory.compute_bytes == 4 * 10 * (100 + 2 * 64) + 4 * 100 * 3
    # the embeddings context: KV for min(4096, n_ctx) tokens, and one 32-token chunk's logits and hidden states
    assert memory.embedding_bytes == 2 * 1000 * (2 * 8) * 2 * 2 + 4 * 32 * (2 * 100 + 3 * 64)
    assert memory.grammar_bytes == 28 * 100  # the grammar check's token texts (engine/grammar/gbnf/tokens.py)
    assert memory.total_bytes == (memory.weights_bytes + memory.kv_cache_bytes + memory.compute_bytes
                                  + memory.embedding_bytes + memory.grammar_bytes)
    assert any(line.startswith("chat template  yes") for line in describe(facts, 1000, logit_rows=3))


def test_long_vocabularies_are_skipped_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "vocab.gguf"
    write_model(path, template=None, vocab=5000)
    facts = read_model_facts(path)
    assert facts.vocab_size == 5000
    assert not facts.has_chat_template
    assert facts.metadata["tokenizer.ggml.tokens"].items is None
    assert any("no (a base model: chat is refused, completions work)" in line for line in describe(facts, 100, logit_rows=3))
    assert any(line.startswith("note") for line in describe(facts, 8192, logit_rows=3))  # past the trained context


@pytest.mark.parametrize("content", [b"", b"GGU", b"not a gguf file at all, some text", b"GGUF\x03\x00\x00\x00\x05"])
def test_bad_files_raise_one_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFInfoError):
        read_model_facts(path)


def test_every_truncation_of_a_header_is_an_error_not_a_crash(tmp_path: Path) -> None:
    whole = tmp_path / "whole.gguf"
    write_model(whole, vocab=80)
    data = whole.read_bytes()
    header_end = data.index(b"blk.0.attn_norm.weight") + 40
    cut = tmp_path / "cut.gguf"
    for size in range(24, header_end, 7):
        cut.write_bytes(data[:size])
        with pytest.raises(GGUFInfoError):
            read_model_facts(cut)


def test_the_rows_of_logits_are_the_sequence_ids_or_the_largest_step() -> None:
    # llama.cpp reserves a row per sequence id; a step asks for one per decoding sequence plus its draft rows
    assert logit_rows(parallel=8, cache_slots=8, batch_size=512, speculative=False) == 16
    assert logit_rows(parallel=8, cache_slots=8, batch_size=512, speculative=True) == 8 + MAX_DRAFT_ROWS
    assert logit_rows(parallel=4, cache_slots=0, batch_size=16, speculative=True) == 16  # no more rows than a batch
    assert logit_rows(parallel=4, cache_slots=60, batch_size=512, speculative=True) == 64


def write_vocabulary(path: Path, tokens: list[str], **ids: int) -> None:
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_token_list([token.encode() for token in tokens])
    for key, value in ids.items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    writer.add_chat_template("{{ messages }}")
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_fim_tokens_are_found_by_text_or_by_id_and_lead_ollamas_template(tmp_path: Path) -> None:
    by_text = tmp_path / "text.gguf"
    write_vocabulary(by_text, ["a", "<fim_prefix>", "<fim_middle>", "b", "<fim_suffix>"])
    fim = fim_texts(read_model_facts(by_text))
    assert fim == ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert template(read_model_facts(by_text), fim) == (
        "{{- if .Suffix }}<fim_prefix>{{ .Prompt }}<fim_suffix>{{ .Suffix }}<fim_middle>\n"
        "{{- else }}{{ messages }}{{- end }}")
    by_id = tmp_path / "id.gguf"
    write_vocabulary(by_id, ["a", "<PRE-unknown>", "<|fim_suffix|>", "<|fim_middle|>"], fim_pre_token_id=1)
    assert fim_texts(read_model_facts(by_id)) == ("[FIM_PRE]", "<|fim_suffix|>", "<|fim_middle|>")
    missing = tmp_path / "chat.gguf"
    write_vocabulary(missing, ["a", "<|fim_prefix|>", "<|fim_suffix|>", "fim_middle"])  # no middle token
    assert fim_texts(read_model_facts(missing)) is None
    assert template(read_model_facts(missing), None) == "{{ messages }}"  # the chat template alone, no .Suffix
