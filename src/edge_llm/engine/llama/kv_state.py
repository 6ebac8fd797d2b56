"""One sequence's KV state out of and back into the context: llama.cpp's per-sequence state API
(`llama_state_seq_get_size/get_data/set_data`), for the persistent prefix cache (engine/prefix_cache/disk.py).

The bytes are llama.cpp's own format: the sequence's cells (positions) and, per layer, the K and V rows in the
cache's types. `set_data` checks the layer count, the types and the row sizes against the context and refuses a
mismatch (it returns 0); the prefix store's fingerprint and checksum keep foreign or damaged bytes from getting
this far. Engine thread only: the context is not thread-safe.
"""

from __future__ import annotations

import ctypes
import logging

from edge_llm.engine.llama.bindings import llama_cpp

logger = logging.getLogger(__name__)


def read_sequence_state(ctx: llama_cpp.llama_context_p, seq_id: int) -> bytearray:
    """A copy of `seq_id`'s KV state (cells and their K/V rows), written straight into the returned buffer."""
    size = llama_cpp.llama_state_seq_get_size(ctx, seq_id)
    data = bytearray(size)
    written = llama_cpp.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq_id)
    return data if written == size else data[:written]


def write_sequence_state(ctx: llama_cpp.llama_context_p, seq_id: int, data: bytes) -> bool:
    """Puts saved state into `seq_id` (which must hold nothing); False when llama.cpp refuses it (then `seq_id`
    holds nothing either)."""
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    read = llama_cpp.llama_state_seq_set_data(ctx, buffer, len(data), seq_id)
    if read == 0:
        logger.warning("llama.cpp refused a saved KV state of %d bytes", len(data))
        return False
    return True
