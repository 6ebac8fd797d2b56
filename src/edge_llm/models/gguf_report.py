"""`edge-llm model info`'s report of a GGUF file's facts (models/gguf_info.py), and the byte and count formats
the banner and logs share."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

from edge_llm.models.gguf_info import GGUFInfoError, ModelFacts, read_model_facts


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def human_count(n: int) -> str:
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= limit:
            return f"{n / limit:.2f} {suffix}"
    return str(n)


def kv_types_label(cache_type_k: str, cache_type_v: str) -> str:
    return cache_type_k if cache_type_k == cache_type_v else f"K {cache_type_k}, V {cache_type_v}"


def describe(facts: ModelFacts, n_ctx: int, *, logit_rows: int, cache_type_k: str = "f16",
             cache_type_v: str = "f16") -> Iterator[str]:
    """The lines `edge-llm model info` prints."""
    memory = facts.memory(n_ctx, logit_rows=logit_rows, cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    total = sum(facts.tensor_types.values()) or 1
    mix = ", ".join(f"{name} {count * 100 / total:.1f}%" for name, count in facts.tensor_types.items())

    def optional(value: int | None) -> str:
        return f"{value:,}" if value is not None else "unknown"

    yield f"file           {facts.path}"
    if facts.name:
        yield f"name           {facts.name}"
    yield f"architecture   {facts.architecture}"
    yield f"parameters     {human_count(facts.parameter_count)} ({facts.parameter_count:,} in {facts.tensor_count} tensors)"
    yield f"quantization   {facts.quantization} (tensor types by weights: {mix})"
    yield f"context        {optional(facts.context_length)} tokens (trained)"
    yield f"layers         {optional(facts.block_count)}"
    yield (f"attention      {optional(facts.head_count)} heads, {optional(facts.head_count_kv)} KV heads, "
           f"head size {optional(facts.key_length)}; embedding {optional(facts.embedding_length)}")
    yield f"vocabulary     {optional(facts.vocab_size)} tokens"
    yield f"chat template  {'yes' if facts.has_chat_template else 'no (a base model: chat is refused, completions work)'}"
    yield f"file size      {human_bytes(facts.file_size)} ({facts.file_size:,} bytes)"
    yield (f"memory         ~{human_bytes(memory.total_bytes)} at a context of {n_ctx:,} tokens: "
           f"weights {human_bytes(memory.weights_bytes)} + KV cache {human_bytes(memory.kv_cache_bytes)} "
           f"({kv_types_label(cache_type_k, cache_type_v)}) + compute ~{human_bytes(memory.compute_bytes)} "
           f"+ embeddings ~{human_bytes(memory.embedding_bytes)} + grammar texts ~{human_bytes(memory.grammar_bytes)}")
    if facts.context_length and n_ctx > facts.context_length:
        yield (f"note           {n_ctx:,} tokens is more than the {facts.context_length:,} the model was trained on; "
               "quality drops past that")


def run_info(path: Path, *, as_json: bool, n_ctx: int, logit_rows: int, cache_type_k: str = "f16",
             cache_type_v: str = "f16") -> int:
    """`edge-llm model info`: the facts on stdout; one error line on stderr and exit code 1. `logit_rows`: the rows
    of logits the server keeps (config.logit_rows)."""
    if n_ctx < 1:
        sys.stderr.write("edge-llm: error: --ctx must be at least 1\n")
        return 1
    try:
        facts = read_model_facts(path)
    except GGUFInfoError as exc:
        sys.stderr.write(f"edge-llm: error: {exc}\n")
        return 1
    if as_json:
        sys.stdout.write(json.dumps(facts.to_dict(n_ctx, logit_rows=logit_rows, cache_type_k=cache_type_k,
                                                  cache_type_v=cache_type_v), indent=2) + "\n")
    else:
        sys.stdout.write("\n".join(describe(facts, n_ctx, logit_rows=logit_rows, cache_type_k=cache_type_k,
                                             cache_type_v=cache_type_v)) + "\n")
    return 0
