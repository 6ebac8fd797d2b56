"""Whether a GGUF model has fill-in-the-middle tokens, read from its header without loading it (Ollama's `insert`
capability in /api/show, for a model not loaded yet).

llama.cpp takes the FIM tokens from the header's token ids when they are given, else finds them in the vocabulary
by their text (llama-vocab.cpp, "find FIM_PRE token" and the like): the same texts are looked for here, as
length-prefixed GGUF strings inside the token list's bytes, one `bytes.find` each (the list is never decoded).
"""

from __future__ import annotations

import mmap
import struct

from edge_llm.models.gguf_info import ArrayValue, ModelFacts

_ID_KEYS = (
    ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
)
# llama.cpp's texts for the prefix, suffix and middle tokens (Qwen, StarCoder, Granite, DeepSeek, CodeLlama, GLM).
_TEXTS = (
    ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"),
    ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"),
    ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"),
)


def has_fim_tokens(facts: ModelFacts) -> bool:
    """A prefix, a suffix and a middle token, each by id in the header or by text in the vocabulary."""
    needed = [texts for keys, texts in zip(_ID_KEYS, _TEXTS)
              if not any(isinstance(facts.metadata.get(key), int) for key in keys)]
    if not needed:
        return True
    tokens = facts.metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, ArrayValue) or tokens.item_type != "STRING" or tokens.span[1] <= tokens.span[0]:
        return False
    try:
        with facts.path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return all(any(buffer.find(_encoded(text), *tokens.span) >= 0 for text in texts) for texts in needed)
    except (OSError, ValueError):
        return False


def _encoded(text: str) -> bytes:
    """A GGUF string as stored (little-endian: the byte order of every GGUF file llama.cpp writes today)."""
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw
