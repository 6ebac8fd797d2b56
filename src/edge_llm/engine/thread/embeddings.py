"""Embedding requests on the engine thread: a FIFO of jobs, run one chunk at a time between decode steps.

Pure: the hidden states come from a callable (the runner's `hidden_states`), so the pooling and the order of work
are testable without a model. Chunks are small, so that sequences generating beside an embedding request wait
a few decode steps' time for each, and always the same size, so that an input is always computed the same way
and identical input gives an identical vector (other chunk boundaries would round differently).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge_llm.engine.thread.channel import Outbox, Sender
from edge_llm.engine.types import Embedded, EmbeddingRequest, EmbeddingUnavailableError, Failed, Pooling

if TYPE_CHECKING:  # imported by the first embedding: the model's header check at start-up imports this module
    import numpy as np

logger = logging.getLogger(__name__)

HiddenStates = Callable[[list[int], int], "np.ndarray"]  # (chunk tokens, start position) → rows of hidden states

# Tokens per step. With embeddings on, llama.cpp outputs every row of a batch, logits included: the embedding
# context's output buffer holds EMBEDDING_BATCH × n_vocab floats (19 MB for a 152k vocabulary).
EMBEDDING_BATCH = 32
EMBEDDING_MAX_TOKENS = 4096  # per input (OpenAI's limit is 8,192; llama-server's is its batch, 512 by default)


@dataclass(eq=False)
class _Job:
    request: EmbeddingRequest
    channel: Sender
    vectors: list[np.ndarray] = field(default_factory=list)
    position: int = 0  # within the current input
    pooled: np.ndarray | None = None  # the running sum (mean) or the chosen row (cls, last)

    @property
    def current(self) -> list[int]:
        return self.request.inputs[len(self.vectors)]


class EmbeddingQueue:
    def __init__(self, chunk: int = EMBEDDING_BATCH) -> None:
        self._chunk = chunk
        self._jobs: deque[_Job] = deque()

    @property
    def pending(self) -> bool:
        return bool(self._jobs)

    def add(self, request: EmbeddingRequest, channel: Sender) -> None:
        self._jobs.append(_Job(request, channel))

    def cancel(self, request_id: str) -> bool:
        """Drops a job (its client left); True when there was one."""
        for job in self._jobs:
            if job.request.request_id == request_id:
                self._jobs.remove(job)
                return True
        return False

    def fail_all(self, outbox: Outbox, message: str, code: str) -> None:
        while self._jobs:
            outbox.add(self._jobs.popleft().channel, Failed(message, code=code))

    def step(self, hidden_states: HiddenStates, outbox: Outbox) -> str | None:
        """Runs one chunk of the oldest job; a finished job's answer goes to the outbox and its id is returned."""
        job = self._jobs[0]
        tokens = job.current[job.position:job.position + self._chunk]
        try:
            states = hidden_states(tokens, job.position)
        except EmbeddingUnavailableError as exc:
            self._jobs.popleft()
            outbox.add(job.channel, Failed(f"Embeddings are unavailable: {exc}", code="embeddings_unavailable"))
            return job.request.request_id
        except Exception as exc:  # noqa: BLE001 - one request's failure must not take the engine down
            self._jobs.popleft()
            logger.exception("embedding failed", extra={"request_id": job.request.request_id})
            outbox.add(job.channel, Failed(f"Computing the embedding failed: {exc}", code="engine_error"))
            return job.request.request_id
        job.pooled = _pool(job.request.pooling, job.pooled, states, first_chunk=job.position == 0)
        job.position += len(tokens)
        if job.position < len(job.current):
            return None
        job.vectors.append(_normalised(job.request.pooling, job.pooled, job.position))
        job.position, job.pooled = 0, None
        if len(job.vectors) < len(job.request.inputs):
            return None
        self._jobs.popleft()
        tokens_in = sum(len(tokens) for tokens in job.request.inputs)
        outbox.add(job.channel, Embedded(tuple(job.vectors), tokens_in))
        return job.request.request_id


def _pool(pooling: Pooling, pooled: np.ndarray | None, states: np.ndarray, *, first_chunk: bool) -> np.ndarray:
    import numpy as np

    if pooling is Pooling.MEAN:
        total = states.sum(axis=0, dtype=np.float64)
        return total if pooled is None else pooled + total
    if pooling is Pooling.CLS:
        return states[0].astype(np.float64) if first_chunk else pooled  # type: ignore[return-value]
    return states[-1].astype(np.float64)


def _normalised(pooling: Pooling, pooled: np.ndarray | None, n_tokens: int) -> np.ndarray:
    import numpy as np

    assert pooled is not None
    vector = pooled / n_tokens if pooling is Pooling.MEAN else pooled
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).astype(np.float32)
