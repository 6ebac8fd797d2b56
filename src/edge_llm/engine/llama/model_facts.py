"""What a loaded model says about itself that the runner reads once: its metadata, its infill tokens, whether it can
embed a chunk at a time."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from edge_llm.engine.llama.bindings import llama_cpp
from edge_llm.engine.types import FimTokens


def model_metadata(model: llama_cpp.llama_model_p) -> dict[str, str]:
    """The GGUF metadata as strings, without the vocabulary arrays and the chat template."""
    result: dict[str, str] = {}
    key_buffer = ctypes.create_string_buffer(256)
    value_buffer = ctypes.create_string_buffer(512)
    for i in range(llama_cpp.llama_model_meta_count(model)):
        llama_cpp.llama_model_meta_key_by_index(model, i, key_buffer, len(key_buffer))
        llama_cpp.llama_model_meta_val_str_by_index(model, i, value_buffer, len(value_buffer))
        key = key_buffer.value.decode("utf-8", errors="replace")
        if not key.startswith("tokenizer.ggml.") and key != "tokenizer.chat_template":
            result[key] = value_buffer.value.decode("utf-8", errors="replace")
    return result


def fim_tokens(vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> FimTokens | None:
    def token(read: Callable[[llama_cpp.llama_vocab_p], int]) -> int | None:
        value = read(vocab)
        return value if 0 <= value < n_vocab else None

    prefix, suffix, middle = (token(llama_cpp.llama_vocab_fim_pre), token(llama_cpp.llama_vocab_fim_suf),
                              token(llama_cpp.llama_vocab_fim_mid))
    if prefix is None or suffix is None or middle is None:
        return None
    return FimTokens(prefix, suffix, middle, token(llama_cpp.llama_vocab_fim_rep), token(llama_cpp.llama_vocab_fim_sep))


def embeds_in_chunks(model: llama_cpp.llama_model_p, metadata: dict[str, str]) -> bool:
    """Embeddings are computed a chunk at a time (embedding.py), which needs a causal decoder: an encoder-decoder
    model, or one whose attention looks ahead (BERT-like embedding models), would need its whole input at once."""
    architecture = metadata.get("general.architecture", "")
    causal = metadata.get(f"{architecture}.attention.causal", "true").lower() != "false"
    return causal and not llama_cpp.llama_model_has_encoder(model)
