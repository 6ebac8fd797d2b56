"""POST /api/embed and the older /api/embeddings: Ollama's embeddings, through the embeddings family's engine path
(api/serving/embeddings.py: the same checks, pooling and L2-normalised vectors).

/api/embed cuts an input longer than the model's embedding context to fit (`truncate`, default true; `options.num_ctx`
lowers that context) or, with `truncate: false`, refuses it. `dimensions` other than the model's is refused (Ollama
would cut the vector to its first `dimensions` numbers, which only models trained for it make sense of). An empty
input (or prompt) only loads the model, and answers no vector, as Ollama does.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.params import report_ignored
from edge_llm.api.protocol.ollama import OllamaEmbeddingsRequest, OllamaEmbedRequest
from edge_llm.api.protocol.ollama_answers import embed_answer, embedding_answer
from edge_llm.api.serving.embeddings import EmbeddingServing
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.ollama_stream import Clock

logger = logging.getLogger(__name__)


class OllamaEmbedServing(EmbeddingServing):
    async def ollama_embed(self, request: Request) -> JSONResponse:
        context = request_context(request)
        clock = Clock.of(context)
        body = self.parse(context, OllamaEmbedRequest, await self.json_body(request))
        name = body.model or self.model_id
        options = body.options
        if options is not None:
            report_ignored(context, options.ignored(embedding=True))
        info = self.embedding_model()
        self.check_dimensions(body.dimensions, info)
        texts = body.texts
        if not texts:
            return JSONResponse(embed_answer(name, []))
        inputs = await self.token_inputs(context, texts, info,
                                         limit=options.num_ctx if options is not None else None,
                                         truncate=body.truncate is not False)
        request_id, event = await self.embed(request, inputs, info)
        return JSONResponse(embed_answer(name, [vector.tolist() for vector in event.vectors], total_ns=clock.total_ns(),
                                         load_ns=clock.load_ns, prompt_tokens=event.prompt_tokens),
                            headers={"x-request-id": request_id})

    async def ollama_embeddings(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = self.parse(context, OllamaEmbeddingsRequest, await self.json_body(request))
        if body.options is not None:
            report_ignored(context, body.options.ignored(embedding=True))
        info = self.embedding_model()
        if not body.prompt:
            return JSONResponse(embedding_answer([]))
        inputs = await self.token_inputs(context, body.prompt, info)
        request_id, event = await self.embed(request, inputs, info)
        return JSONResponse(embedding_answer(event.vectors[0].tolist()), headers={"x-request-id": request_id})
