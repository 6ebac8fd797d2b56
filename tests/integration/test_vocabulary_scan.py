"""The load-time vocabulary pass (engine/llama/vocabulary.py) asks llama.cpp only the tokens that can answer each
question; on the real models it finds what asking every token finds."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from edge_llm.engine.llama import loading  # noqa: F401 - llama.cpp's log lines routed, its backend initialised
from edge_llm.engine.llama.vocabulary import grammar_token_texts, scan_vocabulary, special_text
from edge_llm.models.gguf_info import read_model_facts
from edge_llm.testing.server import require_model
from tests.helpers import small_model

pytestmark = pytest.mark.integration


@pytest.fixture(params=["default", "gemma-3-270m"], scope="module")
def model_vocab(request: pytest.FixtureRequest) -> Iterator[tuple[Path, llama_cpp.llama_vocab_p]]:
    path: Path = require_model() if request.param == "default" else small_model()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    yield path, llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


@pytest.fixture
def vocab(model_vocab: tuple[Path, llama_cpp.llama_vocab_p]) -> llama_cpp.llama_vocab_p:
    return model_vocab[1]


def test_one_pass_finds_what_asking_every_token_finds(vocab: llama_cpp.llama_vocab_p) -> None:
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    facts = scan_vocabulary(vocab, n_vocab)
    special_only = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
    buffer = ctypes.create_string_buffer(512)
    assert facts.end_tokens == tuple(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
    assert facts.control == {text: t for t in range(n_vocab)
                             if llama_cpp.llama_vocab_get_attr(vocab, t) & special_only and (text := special_text(vocab, t))}
    assert facts.longest_piece == max(llama_cpp.llama_token_to_piece(vocab, t, buffer, len(buffer), 0, True)
                                      for t in range(n_vocab))
    assert facts.end_tokens and facts.control and facts.longest_piece > 0


def test_the_memory_estimate_holds_the_grammar_token_texts(model_vocab: tuple[Path, llama_cpp.llama_vocab_p]) -> None:
    """The token texts the first grammar request builds are counted in the memory accounting (the estimate behind
    the budget, /metrics and /api/ps), with no more than the bytes the estimate gives them."""
    path, vocab = model_vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    texts = grammar_token_texts(vocab, n_vocab)
    memory = read_model_facts(path).memory(8192, logit_rows=16)
    assert 0.8 * memory.grammar_bytes < texts.nbytes <= memory.grammar_bytes
    assert memory.total_bytes == (memory.weights_bytes + memory.kv_cache_bytes + memory.compute_bytes
                                  + memory.embedding_bytes + memory.grammar_bytes)
