"""POST /tokenize and /detokenize: text ↔ token ids with the loaded model's vocabulary (llama.cpp server's
endpoints)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.protocol.llama_server_answers import detokenized, tokenized
from edge_llm.api.protocol.tokenization import DetokenizeRequest, TokenizeRequest
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.base import Serving

logger = logging.getLogger(__name__)


class TokenizationServing(Serving):
    async def tokenize(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = await self.read(request, TokenizeRequest)
        tokens = await self.off_loop(context,
            self.engine.tokenize, body.content, add_special=body.add_special, parse_special=body.parse_special
        )
        pieces = await self.off_loop(context, self.engine.token_pieces, tokens) if body.with_pieces else None
        return JSONResponse(tokenized(tokens, pieces))

    async def detokenize(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = await self.read(request, DetokenizeRequest)
        for position, token in enumerate(body.tokens):
            self.check_token_ids([token], f"tokens.{position}")
        return JSONResponse(detokenized(await self.off_loop(context, self.engine.detokenize, body.tokens)))
