"""What the runner needs to know about a whole vocabulary, read in one pass at load: the end-of-generation tokens,
the control tokens by their text, and the most bytes of text one token stands for.

A ctypes call costs about half a microsecond, and the pass runs on the GIL beside the API's import at start-up, so
it makes one call per token (its attributes) and one more (its stored text) where that can matter; only the few
tokens that can answer a question are asked it (issue 40: three calls per token took 0.35 s of CPU on a 150k
vocabulary, this takes about a third):
- end of generation: llama.cpp's set is the tokens it forces to CONTROL by their text, plus the ids the header
  names (eos, eot, eom, FIM pad/rep/sep: llama-vocab.cpp, "maintain a list of tokens that cause end-of-generation"),
  so only tokens that are not plain text, and those ids, are asked (the C API has no getter for eom: an eom that
  is plain text and not named by its text, which no model here has, would be missed);
- the longest piece: no token's piece (the bytes it decodes to) is longer than its stored text (byte-level BPE
  stores a byte as one or two UTF-8 bytes, SentencePiece a space as three, byte tokens as `<0xNN>`, special tokens
  as themselves), so pieces are measured from the longest texts down until no text is longer than the longest piece.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import llama_cpp
import numpy as np

logger = logging.getLogger(__name__)

_SPECIAL_ONLY = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN  # parsed only as special
_PLAIN_TEXT = llama_cpp.LLAMA_TOKEN_ATTR_NORMAL


@dataclass(frozen=True)
class VocabularyFacts:
    end_tokens: tuple[int, ...]
    control: dict[str, int]  # the control (and unknown) tokens by their text
    longest_piece: int  # bytes


def piece(vocab: llama_cpp.llama_vocab_p, token: int, *, special: bool) -> bytes:
    """The bytes `token` decodes to (`special`: control tokens as their text, else as nothing)."""
    buffer = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, special)
    if n < 0:
        buffer = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, special)
    return buffer.raw[:n]


def special_text(vocab: llama_cpp.llama_vocab_p, token: int) -> str:
    return piece(vocab, token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""


def scan_vocabulary(vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> VocabularyFacts:
    get_attr, get_text = llama_cpp.llama_vocab_get_attr, llama_cpp.llama_vocab_get_text
    attributes = [get_attr(vocab, token) for token in range(n_vocab)]
    text_lengths = np.fromiter((len(get_text(vocab, token) or b"") for token in range(n_vocab)), np.int64, n_vocab)

    named = (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab),
             llama_cpp.llama_vocab_fim_pad(vocab), llama_cpp.llama_vocab_fim_rep(vocab),
             llama_cpp.llama_vocab_fim_sep(vocab))
    candidates = {token for token, attr in enumerate(attributes) if attr != _PLAIN_TEXT}
    candidates.update(token for token in named if 0 <= token < n_vocab)
    end_tokens = tuple(sorted(token for token in candidates if llama_cpp.llama_vocab_is_eog(vocab, token)))

    control = {text: token for token, attr in enumerate(attributes)
               if attr & _SPECIAL_ONLY and (text := special_text(vocab, token))}

    longest = 0
    for token in np.argsort(-text_lengths, kind="stable").tolist():
        if text_lengths[token] <= longest:
            break
        longest = max(longest, len(piece(vocab, token, special=True)))
    return VocabularyFacts(end_tokens, control, longest)
