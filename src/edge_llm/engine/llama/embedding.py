"""Hidden states for embeddings, from a second small llama.cpp context on the generation context's model.

Its own context, not rows of the generation batch: each input starts from an empty cache and is decoded in the
same chunks every time, so identical input gives a bit-identical vector whatever else the server is doing (in the
shared, unified KV cache the cells, the attention window and the rows beside it would change the arithmetic).
It is created on the first embeddings request (logged) and lives until the model is
freed. The context runs with pooling "none": pooling is done by the caller (engine/thread/embeddings.py), so that an
input may be longer than one batch.
"""

from __future__ import annotations

import logging

import numpy as np

from edge_llm.engine.llama.bindings import llama_cpp
from edge_llm.engine.thread.embeddings import EMBEDDING_BATCH
from edge_llm.engine.types import EmbeddingUnavailableError

logger = logging.getLogger(__name__)



class EmbeddingContext:
    def __init__(self, model: llama_cpp.llama_model_p, *, max_tokens: int, n_threads: int,
                 n_threads_batch: int) -> None:
        if llama_cpp.llama_model_has_encoder(model):
            raise EmbeddingUnavailableError("an encoder-decoder model has no single hidden state per token")
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = max_tokens
        params.n_batch = params.n_ubatch = EMBEDDING_BATCH
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        params.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not self._ctx:
            raise EmbeddingUnavailableError(f"llama.cpp could not create an embedding context of {max_tokens} "
                                            "tokens (not enough memory?)")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(EMBEDDING_BATCH, 0, 1)
        self.dimensions = llama_cpp.llama_model_n_embd_out(model)
        logger.info("embedding context created: up to %d tokens per input, %d dimensions", max_tokens,
                    self.dimensions)

    def hidden_states(self, tokens: list[int], start: int) -> np.ndarray:
        """The final hidden state of each of `tokens`, placed at positions start, start+1, …; start 0 begins a new
        input (the cache is emptied first). At most EMBEDDING_BATCH tokens, all valid ids (checked by the caller)."""
        if start == 0:
            llama_cpp.llama_memory_clear(self._memory, True)
        batch = self._batch
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(tokens)
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode failed with code {code} in the embedding context")
        pointer = llama_cpp.llama_get_embeddings(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(len(tokens), self.dimensions)).copy()

    def close(self) -> None:
        if self._ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
