"""What a GGUF file holds, read from its header alone (no weights loaded): `edge-llm model info`.

The header is walked once with the `gguf` package's own tables (value types, quantization block
sizes, file-type names, key names). Array contents are skipped rather than decoded:
`gguf.GGUFReader` builds a numpy view for every element of every array, which takes 15 s or more
for a 150,000-token vocabulary, while this walk takes a fraction of a second.

Memory at a context of `n_ctx` tokens (what `edge-llm serve` allocates, llama.cpp's CPU backend):

- weights: the tensor data, memory-mapped from the file;
- KV cache: n_layer × n_ctx × n_head_kv × (key_length × K bytes + value_length × V bytes), a value's bytes
  being its cache type's (`--cache-type-k/-v`, engine/llama/kv_types.py): 2 for f16, 34/32 for q8_0, 18/32 for q4_0
  (with key_length = value_length = head_dim and f16 this is n_layer × n_ctx × (n_head_kv × head_dim) × 2 × 2);
- compute: llama.cpp's graph buffer, dominated by the logits of one micro-batch, estimated as
  4 bytes × n_ubatch × (n_vocab + 2 × n_embd), plus the output buffer, 4 bytes × n_vocab × logit_rows
  (one row of logits per sequence id, or the largest step's rows with logits when more: config.logit_rows).
  With flash attention (llama.cpp's default on CPU) this does not grow with the context. Measured on Qwen2.5-Coder-0.5B Q4_K_M (n_ubatch 512, 12 sequences; the output buffer grows by 4 × n_vocab bytes per sequence):
  300.3 MiB + 7.0 MiB, against 300.3 MiB + 7.0 MiB estimated.
- grammar texts: every token's text, packed, for the grammar check (engine/grammar/gbnf/tokens.py), built by the
  first request with a grammar or a schema: BYTES_PER_TOKEN × n_vocab at most (4.1 MiB on the default model).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_llm.models.gguf_constants import (
    GGML_QUANT_SIZES,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
    LlamaFileType,
)

from edge_llm.engine.grammar.gbnf.tokens import BYTES_PER_TOKEN as TOKEN_TEXT_BYTES
from edge_llm.engine.thread.embeddings import EMBEDDING_BATCH, EMBEDDING_MAX_TOKENS
from edge_llm.engine.llama.kv_types import row_bytes

# `edge-llm serve`'s micro-batch: min(--batch-size, 512).
DEFAULT_UBATCH = 512

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
_MAX_KEEP = 64  # arrays longer than this are counted, not kept (vocabularies, merges)


class GGUFInfoError(Exception):
    """The file cannot be read as GGUF (one line for the user)."""


@dataclass(frozen=True)
class ArrayValue:
    """An array from the header: its element type and length; the items only for short arrays."""

    item_type: str
    length: int
    items: list[Any] | None
    span: tuple[int, int] = field(default=(0, 0), compare=False)  # the items' bytes in the file (start, end)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_name: str
    n_elements: int
    n_bytes: int
    offset: int = 0  # into the data section


@dataclass(frozen=True)
class MemoryEstimate:
    n_ctx: int
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    embedding_bytes: int = 0  # the /v1/embeddings context, made on the first embeddings request
    grammar_bytes: int = 0  # the grammar check's token texts, built by the first request with a grammar or schema
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.compute_bytes + self.embedding_bytes
                + self.grammar_bytes)


@dataclass(frozen=True)
class ModelFacts:
    path: Path
    file_size: int
    gguf_version: int
    architecture: str
    name: str | None
    parameter_count: int
    tensor_count: int
    tensor_data_bytes: int
    file_type: str | None  # general.file_type's name, e.g. Q4_K_M
    tensor_types: dict[str, int]  # elements per tensor type, largest first
    context_length: int | None
    block_count: int | None
    embedding_length: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    vocab_size: int | None
    has_chat_template: bool
    metadata: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def dominant_tensor_type(self) -> str | None:
        return next(iter(self.tensor_types), None)

    @property
    def quantization(self) -> str:
        return self.file_type or self.dominant_tensor_type or "unknown"

    def kv_bytes_per_token(self, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
        """K and V of one token (one KV cell) for every layer, in the given cache types; 0 when the header lacks
        attention facts (e.g. recurrent models)."""
        if not (self.block_count and self.head_count_kv and self.key_length and self.value_length):
            return 0
        return self.block_count * (row_bytes(cache_type_k, self.head_count_kv * self.key_length)
                                   + row_bytes(cache_type_v, self.head_count_kv * self.value_length))

    def memory(self, n_ctx: int, *, logit_rows: int, n_ubatch: int = DEFAULT_UBATCH, cache_type_k: str = "f16",
               cache_type_v: str = "f16") -> MemoryEstimate:
        vocab = self.vocab_size or 0
        width = self.embedding_length or 0
        compute = 4 * n_ubatch * (vocab + 2 * width) + 4 * vocab * logit_rows
        # engine/llama/embedding.py: its KV cells, and the logits and hidden states of one chunk, output and computed
        embedding_ctx = min(EMBEDDING_MAX_TOKENS, n_ctx, self.context_length or n_ctx)
        # (the embedding context keeps f16: engine/llama/embedding.py does not take the cache types)
        embedding = embedding_ctx * self.kv_bytes_per_token() + 4 * EMBEDDING_BATCH * (2 * vocab + 3 * width)
        kv = n_ctx * self.kv_bytes_per_token(cache_type_k, cache_type_v)
        return MemoryEstimate(n_ctx, self.tensor_data_bytes, kv, compute, embedding, TOKEN_TEXT_BYTES * vocab,
                              cache_type_k, cache_type_v)

    def to_dict(self, n_ctx: int, *, logit_rows: int, cache_type_k: str = "f16", cache_type_v: str = "f16"
                ) -> dict[str, Any]:
        memory = self.memory(n_ctx, logit_rows=logit_rows, cache_type_k=cache_type_k, cache_type_v=cache_type_v)
        return {
            "path": str(self.path),
            "file_size": self.file_size,
            "gguf_version": self.gguf_version,
            "architecture": self.architecture,
            "name": self.name,
            "parameter_count": self.parameter_count,
            "tensor_count": self.tensor_count,
            "quantization": self.quantization,
            "file_type": self.file_type,
            "dominant_tensor_type": self.dominant_tensor_type,
            "tensor_types": self.tensor_types,
            "context_length": self.context_length,
            "block_count": self.block_count,
            "embedding_length": self.embedding_length,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv,
            "key_length": self.key_length,
            "value_length": self.value_length,
            "vocab_size": self.vocab_size,
            "has_chat_template": self.has_chat_template,
            "memory": {**asdict(memory), "total_bytes": memory.total_bytes,
                       "kv_bytes_per_token": self.kv_bytes_per_token(cache_type_k, cache_type_v),
                       "n_ubatch": DEFAULT_UBATCH, "logit_rows": logit_rows},
        }


class _Cursor:
    def __init__(self, buffer: mmap.mmap, endian: str, max_keep: int | None = _MAX_KEEP) -> None:
        self.buffer = buffer
        self.endian = endian
        self.offset = 0
        self.max_keep = max_keep  # None: every array's items are kept

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.endian + fmt, self.buffer, self.offset)
        except struct.error:
            raise GGUFInfoError("the GGUF header is truncated") from None
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise GGUFInfoError("the GGUF header is truncated")
        text = bytes(self.buffer[self.offset:end]).decode("utf-8", errors="replace")
        self.offset = end
        return text

    def skip_strings(self, count: int) -> None:
        # A vocabulary is ~150,000 strings: one tight loop instead of a method call and a format parse for each.
        read_length = struct.Struct(self.endian + "Q").unpack_from
        buffer, offset, end = self.buffer, self.offset, len(self.buffer)
        try:
            for _ in range(count):
                offset += 8 + read_length(buffer, offset)[0]
        except struct.error:
            raise GGUFInfoError("the GGUF header is truncated") from None
        if offset > end:
            raise GGUFInfoError("the GGUF header is truncated")
        self.offset = offset

    def value(self, value_type: GGUFValueType) -> Any:
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type == GGUFValueType.ARRAY:
            return self.array()
        fmt = _SCALARS.get(value_type)
        if fmt is None:
            raise GGUFInfoError(f"unknown GGUF value type {int(value_type)}")
        return self.unpack(fmt)

    def array(self) -> ArrayValue:
        item_type = _value_type(self.unpack("I"))
        length = self.unpack("Q")
        start = self.offset
        if self.max_keep is None or length <= self.max_keep:
            items = [self.value(item_type) for _ in range(length)]
            return ArrayValue(item_type.name, length, items, (start, self.offset))
        if item_type == GGUFValueType.STRING:
            self.skip_strings(length)
        elif item_type == GGUFValueType.ARRAY:
            for _ in range(length):
                self.array()
        else:
            fmt = _SCALARS.get(item_type)
            if fmt is None:
                raise GGUFInfoError(f"unknown GGUF value type {int(item_type)}")
            self.offset += length * struct.calcsize(fmt)
        return ArrayValue(item_type.name, length, None, (start, self.offset))


def _value_type(raw: int) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFInfoError(f"unknown GGUF value type {raw} (corrupt header?)") from None


def _tensor_bytes(type_id: int, n_elements: int) -> tuple[str, int]:
    try:
        quant = GGMLQuantizationType(type_id)
    except ValueError:
        return f"type{type_id}", 0
    block_size, type_size = GGML_QUANT_SIZES.get(quant, (1, 0))
    return quant.name, n_elements // block_size * type_size


def _walk(cursor: _Cursor) -> tuple[int, dict[str, Any], list[TensorInfo]]:
    version = cursor.unpack("I")
    n_tensors = cursor.unpack("Q")
    n_kv = cursor.unpack("Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cursor.string()
        metadata[key] = cursor.value(_value_type(cursor.unpack("I")))
    tensors = []
    for _ in range(n_tensors):
        name = cursor.string()
        n_dims = cursor.unpack("I")
        if n_dims > 8:
            raise GGUFInfoError(f"tensor {name!r} claims {n_dims} dimensions (corrupt header?)")
        shape = tuple(cursor.unpack("Q") for _ in range(n_dims))
        type_id = cursor.unpack("I")
        offset = cursor.unpack("Q")
        n_elements = 1
        for dim in shape:
            n_elements *= dim
        type_name, n_bytes = _tensor_bytes(type_id, n_elements)
        tensors.append(TensorInfo(name, shape, type_name, n_elements, n_bytes, offset))
    return version, metadata, tensors


def read_model_facts(path: Path, *, max_keep: int | None = _MAX_KEEP) -> ModelFacts:
    """Raises GGUFInfoError for a missing, non-GGUF or truncated file. A file is walked once while it is unchanged
    (the start-up checks, the memory estimate and the banner all read it). Arrays of more than `max_keep` items are
    counted, not decoded (None: every item is decoded, as Ollama's verbose /api/show lists them)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise GGUFInfoError(f"file not found: {path}") from None
    except PermissionError:
        raise GGUFInfoError(f"permission denied: {path}") from None
    return _read_unchanged(path, stat.st_size, stat.st_mtime_ns, max_keep)


@lru_cache(maxsize=8)
def _read_unchanged(path: Path, size: int, _mtime_ns: int, max_keep: int | None) -> ModelFacts:
    try:
        with path.open("rb") as file:
            if size < 24:
                raise GGUFInfoError(f"not a GGUF file ({size} bytes, too small): {path}")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                if struct.unpack_from("<I", buffer, 0)[0] != GGUF_MAGIC:
                    raise GGUFInfoError(f"not a GGUF file (bad magic bytes): {path}")
                endian = "<" if struct.unpack_from("<I", buffer, 4)[0] < 0x10000 else ">"
                cursor = _Cursor(buffer, endian, max_keep)
                cursor.offset = 4
                version, metadata, tensors = _walk(cursor)
                header_end = cursor.offset
    except FileNotFoundError:
        raise GGUFInfoError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise GGUFInfoError(f"not a file: {path}") from None
    except PermissionError:
        raise GGUFInfoError(f"permission denied: {path}") from None
    if version < 2:
        raise GGUFInfoError(f"GGUF version {version} is too old (2 or later is supported): {path}")
    alignment = int(metadata.get("general.alignment", 32) or 32)
    data_start = -(-header_end // alignment) * alignment
    needed = data_start + max((t.offset + t.n_bytes for t in tensors), default=0)
    if size < needed:
        raise GGUFInfoError(f"the file is truncated ({size:,} bytes; its tensors need {needed:,}): {path}")
    return _facts(path, size, version, metadata, tensors)


def _facts(path: Path, size: int, version: int, metadata: dict[str, Any], tensors: list[TensorInfo]) -> ModelFacts:
    arch = str(metadata.get(Keys.General.ARCHITECTURE, "unknown"))

    def arch_int(key_template: str) -> int | None:
        value = metadata.get(key_template.format(arch=arch))
        if isinstance(value, ArrayValue):  # per-layer values (a few architectures): take the largest
            return max((int(v) for v in value.items or []), default=None)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    by_type: dict[str, int] = {}
    for tensor in tensors:
        by_type[tensor.type_name] = by_type.get(tensor.type_name, 0) + tensor.n_elements
    embedding = arch_int(Keys.LLM.EMBEDDING_LENGTH)
    heads = arch_int(Keys.Attention.HEAD_COUNT)
    head_dim = embedding // heads if embedding and heads else None
    tokens = metadata.get(Keys.Tokenizer.LIST)
    vocab = arch_int(Keys.LLM.VOCAB_SIZE) or (tokens.length if isinstance(tokens, ArrayValue) else None)
    file_type = metadata.get(Keys.General.FILE_TYPE)
    template = metadata.get(Keys.Tokenizer.CHAT_TEMPLATE)
    name = metadata.get(Keys.General.NAME)
    return ModelFacts(
        path=path,
        file_size=size,
        gguf_version=version,
        architecture=arch,
        name=str(name) if name is not None else None,
        parameter_count=sum(t.n_elements for t in tensors),
        tensor_count=len(tensors),
        tensor_data_bytes=sum(t.n_bytes for t in tensors),
        file_type=_file_type_name(file_type),
        tensor_types=dict(sorted(by_type.items(), key=lambda item: -item[1])),
        context_length=arch_int(Keys.LLM.CONTEXT_LENGTH),
        block_count=arch_int(Keys.LLM.BLOCK_COUNT),
        embedding_length=embedding,
        head_count=heads,
        head_count_kv=arch_int(Keys.Attention.HEAD_COUNT_KV) or heads,
        key_length=arch_int(Keys.Attention.KEY_LENGTH) or head_dim,
        value_length=arch_int(Keys.Attention.VALUE_LENGTH) or head_dim,
        vocab_size=vocab,
        has_chat_template=isinstance(template, str) and bool(template.strip()),
        metadata=metadata,
    )


def _file_type_name(value: Any) -> str | None:
    if not isinstance(value, int):
        return None
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file type {value}"
