"""A GGUF model's fill-in-the-middle tokens, read from its header without loading it (Ollama's `insert`
capability and the `.Suffix` template in /api/show, for a model not loaded yet).

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


_LABELS = ("[FIM_PRE]", "[FIM_SUF]", "[FIM_MID]")  # for a token given by id whose text is none of the known ones


def fim_texts(facts: ModelFacts) -> tuple[str, str, str] | None:
    """The prefix, suffix and middle tokens' texts, each found in the vocabulary by its known text or given by id
    in the header (then labelled); None when one of the three is missing."""
    tokens = facts.metadata.get("tokenizer.ggml.tokens")
    found: list[str] = []
    try:
        with facts.path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            for keys, texts, label in zip(_ID_KEYS, _TEXTS, _LABELS):
                text = _first_in(buffer, tokens, texts)
                if text is None and any(isinstance(facts.metadata.get(key), int) for key in keys):
                    text = label
                if text is None:
                    return None
                found.append(text)
    except (OSError, ValueError):
        return None
    return found[0], found[1], found[2]


def _first_in(buffer: mmap.mmap, tokens: object, texts: tuple[str, ...]) -> str | None:
    if not isinstance(tokens, ArrayValue) or tokens.item_type != "STRING" or tokens.span[1] <= tokens.span[0]:
        return None
    return next((text for text in texts if buffer.find(_encoded(text), *tokens.span) >= 0), None)


def _encoded(text: str) -> bytes:
    """A GGUF string as stored (little-endian: the byte order of every GGUF file llama.cpp writes today)."""
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw
