"""POST /v1/embeddings (and /embeddings): one vector per input from the served model's hidden states.

Inputs are strings or token ids (OpenAI's four forms); each is checked (not empty, within the model's embedding
length, valid token ids) before the engine sees it. The vectors are pooled as `--pooling` says and L2-normalised;
the engine computes them between decode steps (engine/thread/embeddings.py).
"""

from __future__ import annotations

import base64
import logging

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.errors import from_engine_error, invalid_request
from edge_llm.api.protocol.embeddings import (
    MAX_INPUTS,
    MAX_REQUEST_TOKENS,
    EmbeddingsRequest,
    Input,
    embedding_list,
)
from edge_llm.api.request_context import RequestContext, request_context
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.outcome import engine_unavailable, failure_error
from edge_llm.engine.types import (
    Embedded,
    EmbeddingRequest,
    EngineError,
    EngineUnavailableError,
    Failed,
    ModelInfo,
    Pooling,
)

logger = logging.getLogger(__name__)

# GGUF `<arch>.pooling_type` (llama.cpp's enum) → ours; 0 (none) and 4 (rank) fall back to mean
_GGUF_POOLING = {"1": Pooling.MEAN, "2": Pooling.CLS, "3": Pooling.LAST}


class EmbeddingServing(Serving):
    async def embeddings(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = await self.read(request, EmbeddingsRequest)
        info = self.embedding_model()
        self.check_dimensions(body.dimensions, info)
        inputs = await self.token_inputs(context, body.inputs, info)
        request_id, event = await self.embed(request, inputs, info)
        vectors = [_encoded(vector, body.encoding_format) for vector in event.vectors]
        return JSONResponse(embedding_list(vectors, self.answer_model(context), event.prompt_tokens),
                            headers={"x-request-id": request_id})

    async def embed(self, request: Request, inputs: list[list[int]], info: ModelInfo) -> tuple[str, Embedded]:
        """The vectors of checked token inputs (`token_inputs`), and the engine request's id; the work is aborted
        when the client leaves first."""
        request_id = request_context(request).id
        try:
            channel = self.engine.submit_embedding(EmbeddingRequest(request_id, inputs, self.pooling(info)))
        except EngineError as exc:
            raise from_engine_error(exc) from None

        async def answer() -> Embedded | Failed:
            async for event in channel:
                if isinstance(event, (Embedded, Failed)):
                    return event
            raise AssertionError("the engine ended an embedding request without an answer")

        event = await self.while_connected(request, request_id, answer())
        if isinstance(event, Failed):
            raise failure_error(event)
        return request_id, event

    def check_dimensions(self, dimensions: int | None, info: ModelInfo) -> None:
        if dimensions is not None and dimensions != info.embedding_dimensions:
            raise invalid_request(f"This model's embeddings have {info.embedding_dimensions} dimensions; "
                                  "`dimensions` cannot change that", param="dimensions")

    def pooling(self, info: ModelInfo) -> Pooling:
        if self.settings.pooling != "auto":
            return Pooling(self.settings.pooling)
        declared = next((value for key, value in info.metadata.items() if key.endswith(".pooling_type")), None)
        return _GGUF_POOLING.get(declared or "", Pooling.MEAN)

    def embedding_model(self) -> ModelInfo:
        info = self.engine.model_info
        if info is None:
            raise engine_unavailable(EngineUnavailableError("The model is not loaded yet"))
        if not info.embedding_dimensions:
            raise invalid_request(f"The model '{self.model_id}' cannot compute embeddings here: it is an "
                                  "encoder-decoder model, or an embedding model whose attention looks ahead, which "
                                  "needs its whole input in one batch", param="model", code="embeddings_not_supported")
        return info

    def token_limit(self, info: ModelInfo) -> int:
        """The most tokens one input may have."""
        return min(info.embedding_max_tokens, self.settings.max_prompt_tokens or info.embedding_max_tokens)

    async def token_inputs(self, context: RequestContext, given: str | list[str] | list[Input], info: ModelInfo, *,
                           limit: int | None = None, truncate: bool = False) -> list[list[int]]:
        """Each input as token ids, checked; texts are tokenized in the tokenizer thread (an input may be text pieces
        and token ids mixed). An input longer than `limit` (at most `token_limit`) is refused, or with `truncate`
        keeps its first tokens (Ollama's `truncate`)."""
        items: list[str] | list[Input] = [given] if isinstance(given, str) else given
        if not items:
            raise invalid_request("`input` must not be empty", param="input")
        if len(items) > MAX_INPUTS:
            raise invalid_request(f"`input` has {len(items)} items; at most {MAX_INPUTS} are allowed", param="input")
        with_text = [item for item in items if not _ids_only(item)]
        tokenized = iter(await self.off_loop(context, self._tokenize_all, with_text) if with_text else [])
        inputs = [list(item) if _ids_only(item) else next(tokenized) for item in items]  # type: ignore[arg-type]
        limit = min(limit or self.token_limit(info), self.token_limit(info))
        if truncate:
            inputs = [tokens[:limit] for tokens in inputs]
        total = 0
        for index, tokens in enumerate(inputs):
            param = "input" if len(inputs) == 1 else f"input.{index}"
            if not tokens:
                raise invalid_request("An input to embed must not be empty", param=param)
            if len(tokens) > limit:
                raise invalid_request(f"This server embeds inputs of at most {limit} tokens; the input has "
                                      f"{len(tokens)}", param=param, code="context_length_exceeded")
            self.check_token_ids(tokens, param)
            total += len(tokens)
        if total > MAX_REQUEST_TOKENS:
            raise invalid_request(f"The inputs have {total} tokens together; at most {MAX_REQUEST_TOKENS} are "
                                  "allowed in one request", param="input")
        return inputs

    def _tokenize_all(self, items: list[str] | list[Input]) -> list[list[int]]:
        """Texts as the model reads them (its BOS when it adds one, before a first piece of text, as llama-server's
        tokenize_mixed); control-token spellings stay text."""
        result = []
        for item in items:
            tokens: list[int] = []
            for index, piece in enumerate([item] if isinstance(item, str) else item):
                if isinstance(piece, str):
                    if piece:
                        tokens.extend(self.engine.tokenize(piece, add_special=index == 0, parse_special=False))
                else:
                    tokens.append(piece)
            result.append(tokens)
        return result


def _ids_only(item: str | Input) -> bool:
    return not isinstance(item, str) and all(isinstance(piece, int) for piece in item)


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()

