"""The load-time vocabulary pass (engine/llama/vocabulary.py) asks llama.cpp only the tokens that can answer each
question; on the real models it finds what asking every token finds."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from edge_llm.engine.llama import loading  # noqa: F401 - llama.cpp's log lines routed, its backend initialised
from edge_llm.engine.llama.vocabulary import scan_vocabulary, special_text
from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.models.fetch import fetch, models_dir
from edge_llm.testing.server import require_model

pytestmark = pytest.mark.integration


@pytest.fixture(params=["default", "gemma-3-270m"], scope="module")
def vocab(request: pytest.FixtureRequest) -> Iterator[llama_cpp.llama_vocab_p]:
    path: Path = require_model() if request.param == "default" else fetch(GEMMA_3_270M, models_dir())
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


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
