"""What the runner needs to know about a whole vocabulary, read once at load: the end-of-generation tokens,
the control tokens by their text, and the most bytes of text one token stands for.

A ctypes call costs about half a microsecond, and the pass runs on the GIL beside the API's import at start-up, so
it makes two cheap calls per token (its attributes, its stored text), and only the few tokens that can answer a
question are asked it (issue 40: three calls per token took 0.35 s of CPU on a 150k vocabulary, this about half):
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
import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass

from edge_llm.engine.llama.bindings import llama_cpp
from edge_llm.engine.grammar.gbnf.tokens import TokenTexts

logger = logging.getLogger(__name__)

_SPECIAL_ONLY = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN  # parsed only as special
_PLAIN_TEXT = llama_cpp.LLAMA_TOKEN_ATTR_NORMAL
_LONGEST_TEXTS = 64  # texts looked at first for the longest piece (the default model needs 22)


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
    # Nothing of the vocabulary's size is held at once: in this (short-lived) thread, a buffer of 150k lengths left
    # 3 MB of heap that stayed for the life of the process.
    not_plain = [(token, attr) for token in range(n_vocab) if (attr := get_attr(vocab, token)) != _PLAIN_TEXT]

    named = (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab),
             llama_cpp.llama_vocab_fim_pad(vocab), llama_cpp.llama_vocab_fim_rep(vocab),
             llama_cpp.llama_vocab_fim_sep(vocab))
    candidates = {token for token, _ in not_plain}
    candidates.update(token for token in named if 0 <= token < n_vocab)
    end_tokens = tuple(sorted(token for token in candidates if llama_cpp.llama_vocab_is_eog(vocab, token)))

    control = {text: token for token, attr in not_plain if attr & _SPECIAL_ONLY and (text := special_text(vocab, token))}

    longest = longest_piece(lambda token: len(get_text(vocab, token) or b""),
                            lambda token: len(piece(vocab, token, special=True)), n_vocab)
    return VocabularyFacts(end_tokens, control, longest)


def longest_piece(text_length: Callable[[int], int], piece_length: Callable[[int], int], n_vocab: int,
                  first_look: int = _LONGEST_TEXTS) -> int:
    """The longest piece, measured on the tokens with the longest texts only, from the longest down to a text no
    longer than the longest piece found (no piece is longer than its text)."""
    count = first_look
    while True:
        longest_texts = heapq.nlargest(count, ((text_length(token), token) for token in range(n_vocab)))
        longest = 0
        for length, token in longest_texts:
            if length <= longest:
                return longest
            longest = max(longest, piece_length(token))
        if len(longest_texts) < count:  # that was every token
            return longest
        count *= 16  # every one of those texts was longer than any of their pieces: look further down


def token_texts(vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> list[str]:
    """Every token's text as llama.cpp's grammar sampler splits it into characters (its piece, a control token as
    its text; a piece that ends inside a character loses that part), for the grammar check (engine/grammar/gbnf)."""
    return [piece(vocab, token, special=True).decode("utf-8", errors="ignore") for token in range(n_vocab)]


def grammar_token_texts(vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> TokenTexts:
    """The packed token texts for the grammar check. Building them takes vocabulary-sized temporaries (a list and a
    set of 150k strings) in a short-lived thread, and glibc keeps the freed pages of that thread's heap: ~10 MB of
    RssAnon for the life of the server unless the heaps are trimmed once they are freed."""
    texts = TokenTexts(token_texts(vocab, n_vocab))
    _trim_heaps()
    return texts


def _trim_heaps() -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        logger.debug("malloc_trim is not available")
