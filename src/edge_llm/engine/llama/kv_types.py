"""The KV-cache data types llama.cpp can store K and V in on the CPU (`--cache-type-k`, `--cache-type-v`): their
ggml type ids and sizes, for the context parameters and the memory estimate. Pure; no llama.cpp.

The list is llama.cpp's own (common/arg.cpp, `kv_cache_types`). A quantized type packs 32 values into a block, so
a head size must be a multiple of 32 to use it; a quantized V needs flash attention (llama.cpp refuses the context
otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KvCacheType = Literal["f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "bf16", "f32"]


@dataclass(frozen=True)
class KvTypeFacts:
    ggml_type: int  # enum ggml_type
    block_size: int  # values per block
    block_bytes: int  # bytes per block

    @property
    def quantized(self) -> bool:
        return self.block_size > 1


KV_TYPES: dict[str, KvTypeFacts] = {
    "f32": KvTypeFacts(0, 1, 4),
    "f16": KvTypeFacts(1, 1, 2),
    "bf16": KvTypeFacts(30, 1, 2),
    "q8_0": KvTypeFacts(8, 32, 34),
    "q4_0": KvTypeFacts(2, 32, 18),
    "q4_1": KvTypeFacts(3, 32, 20),
    "iq4_nl": KvTypeFacts(20, 32, 18),
    "q5_0": KvTypeFacts(6, 32, 22),
    "q5_1": KvTypeFacts(7, 32, 24),
}


def row_bytes(kv_type: str, n_values: int) -> int:
    """Bytes of one row of `n_values` values stored as `kv_type` (ggml_row_size)."""
    facts = KV_TYPES[kv_type]
    return n_values // facts.block_size * facts.block_bytes


def is_quantized(kv_type: str) -> bool:
    return KV_TYPES[kv_type].quantized


def head_size_problem(kv_type: str, head_size: int | None, which: str) -> str | None:
    """Why `kv_type` cannot hold heads of `head_size` values (a quantized block must not straddle two heads), or
    None when it can (or the head size is unknown)."""
    block = KV_TYPES[kv_type].block_size
    if head_size is None or block == 1 or head_size % block == 0:
        return None
    return (f"--cache-type-{which} {kv_type} stores blocks of {block} values, which do not divide this model's "
            f"head size of {head_size}; use f16, bf16 or f32")
