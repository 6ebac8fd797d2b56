"""Plain data passed between the HTTP side and the engine thread."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported by the engine's runner, after the model load began (issue 40)
    import numpy as np


class FinishReason(str, enum.Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens or the context ran out
    CANCELLED = "cancelled"  # the client went away
    TIMEOUT = "timeout"  # --request-timeout passed; the output so far is kept


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False  # end-of-generation tokens are never sampled: the answer runs to max_tokens
    grammar: str | None = None  # GBNF with a `root` rule; constrains every sampled token

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the k likeliest
    cache_prompt: bool = True  # False: neither reuses nor leaves a prefix-cache entry (llama-server's field)
    reuse_min: int = 0  # > 0: a cached chunk of at least this many tokens may be moved into place (--cache-reuse)
    speculative: bool = True  # False: never drafts, even when the engine speculates (--speculative ngram)


class Pooling(str, enum.Enum):
    """How an input's per-token hidden states become one embedding vector."""

    MEAN = "mean"  # their average: the usual choice for a model not trained for embeddings
    LAST = "last"  # the last token's (it has attended to the whole input in a causal model)
    CLS = "cls"  # the first token's (models trained with a leading [CLS] summary token)


@dataclass
class EmbeddingRequest:
    request_id: str
    inputs: list[list[int]]  # token ids, each input non-empty, within ModelInfo.embedding_max_tokens
    pooling: Pooling = Pooling.MEAN


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class FimTokens:
    """The model's fill-in-the-middle control tokens (llama.cpp's vocab FIM ids); None where it has none."""

    prefix: int
    suffix: int
    middle: int
    repo: int | None = None  # before the repository name
    file_sep: int | None = None  # before each file's name


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model, read once when it is loaded."""

    path: Path
    description: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    bos_text: str
    eos_text: str
    add_bos: bool
    bos_token: int | None  # the BOS token to put first, None when the model adds none
    metadata: dict[str, str]
    fim: FimTokens | None = None  # None: the model was not trained for fill-in-the-middle
    can_move_cells: bool = False  # KV cells can be moved to other positions (RoPE models): --cache-reuse works
    embedding_dimensions: int = 0  # the length of an embedding vector; 0: this model cannot embed here
    embedding_max_tokens: int = 0  # the longest input an embedding is computed for
    # the control tokens by their text: what special-token parsing reads in a text (never in a request's values)
    control_tokens: dict[str, int] = field(default_factory=dict)
    # the most bytes of text one token stands for: a text of B bytes is at least B / this many tokens (0: unknown)
    max_token_bytes: int = 0
    end_tokens: tuple[int, ...] = ()  # the end-of-generation tokens (what ignore_eos bans)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, read from any thread."""

    waiting: int
    running: int
    cached_sequences: int
    kv_cells_used: int  # distinct cells held by running and cached sequences (shared prefixes count once)
    kv_cells_total: int
    preemptions: int = 0  # since start: running sequences put back in the queue to free KV cells
    aborted_steps: int = 0  # since start: decode steps stopped part-way, every request in them cancelled
    evictions: dict[str, int] = field(default_factory=dict)  # since start: prefix-cache entries dropped, by reason
    drafted_tokens: int = 0  # since start: draft tokens verified (speculative decoding)
    accepted_tokens: int = 0  # … and accepted
    drafted_by_position: tuple[int, ...] = ()  # draft tokens verified at draft position 1, 2, …
    accepted_by_position: tuple[int, ...] = ()  # … and accepted there
    kv_bytes_per_cell: int = 0  # K and V of one cell in every layer, in the cache's types (0: unknown)
    disk_cache: dict[str, Any] | None = None  # the persistent prefix cache's figures (engine/prefix_cache/disk.py), if on
    watchdog_stalls: int = 0  # since start: steps or tokenizer jobs that ran past --watchdog-seconds
    stalled_threads: int = 0  # engine or tokenizer threads on such a job now

    @staticmethod
    def total(snapshots: Sequence[EngineStats]) -> EngineStats:
        """Several engines' snapshots summed field by field (the server's totals over every loaded model): numbers
        added, per-key counts merged, per-position counts added position by position; the bytes of a cell only
        when every model's are the same (else 0: unknown)."""
        if not snapshots:
            return EngineStats(0, 0, 0, 0, 0)
        values: dict[str, Any] = {}
        for f in fields(EngineStats):
            parts = [getattr(s, f.name) for s in snapshots if getattr(s, f.name) is not None]
            if f.name == "kv_bytes_per_cell":
                values[f.name] = parts[0] if len(set(parts)) == 1 else 0
            elif not parts:
                values[f.name] = None
            elif isinstance(parts[0], dict):
                merged: dict[str, Any] = {}
                for part in parts:
                    for key, count in part.items():
                        merged[key] = merged.get(key, 0) + count
                values[f.name] = merged
            elif isinstance(parts[0], tuple):
                width = max(len(p) for p in parts)
                values[f.name] = tuple(sum(p[i] for p in parts if i < len(p)) for i in range(width))
            else:
                values[f.name] = sum(parts)
        return EngineStats(**values)


# What flows back on a request's reply channel, in order: TextDelta*, then Finished or Failed.


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()  # (token, piece, logprob), likeliest first


@dataclass(frozen=True)
class TextDelta:
    text: str
    token_count: int  # tokens generated so far
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens behind this text, when asked for


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    usage: Usage
    timings: dict[str, float]
    stop_sequence: str | None = None  # the stop string that ended the answer (reason STOP), if one did


@dataclass(frozen=True)
class Failed:
    message: str
    code: str = "engine_error"


@dataclass(frozen=True)
class Embedded:
    """The answer of an EmbeddingRequest: one L2-normalised float32 vector per input, in input order."""

    vectors: tuple[np.ndarray, ...]
    prompt_tokens: int


EngineEvent = TextDelta | Finished | Failed | Embedded


@dataclass(frozen=True)
class PrefillProgress:
    """A prompt's prefill moved by a chunk and is not over (never the only event: a stream may show it, llama-server's
    `return_progress` style; the reply channel hands it to its `on_progress`, not to the answer's events)."""

    processed: int  # positions of the prompt in the KV cache, cached ones included
    total: int
    cached: int  # of them, taken from the prefix cache


class EngineError(Exception):
    """Base of the errors the engine raises to its callers."""


class QueueFullError(EngineError):
    pass


class EngineUnavailableError(EngineError):
    pass


class OutOfCellsError(EngineError):
    """The KV cache had no room for a batch (llama_decode returned 1)."""


class StepAbortedError(EngineError):
    """llama_decode stopped part-way because every request in the batch was cancelled (it returned 2)."""


class EmbeddingUnavailableError(EngineError):
    """This model cannot compute embeddings here (an encoder-decoder model, or no memory for the context)."""


class GrammarTooCostly(EngineError):
    """Checking the vocabulary against a sequence's grammar took longer than the step budget
    (--grammar-step-budget-ms): the request ends, the other sequences go on."""


class SamplingExhausted(EngineError):
    """No token may follow under the request's grammar and logit_bias.

    `complete`: the grammar is complete and only a (banned) end token could follow, so the answer is over;
    otherwise logit_bias bans everything the grammar allows, which is the request's own contradiction."""

    def __init__(self, message: str, *, complete: bool) -> None:
        super().__init__(message)
        self.complete = complete
