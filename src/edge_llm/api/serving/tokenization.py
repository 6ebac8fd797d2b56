"""POST /tokenize and /detokenize: text ↔ token ids with the loaded model's vocabulary (llama.cpp server's
endpoints)."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.protocol.tokenization import DetokenizeRequest, TokenizeRequest
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.base import Serving

logger = logging.getLogger(__name__)


def _piece(piece: bytes) -> str | list[int]:
    """llama-server's `piece`: the token's text, or its bytes when they are not UTF-8 on their own (a part of a
    multi-byte character)."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


class TokenizationServing(Serving):
    async def tokenize(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = await self.read(request, TokenizeRequest)
        tokens = await self.off_loop(context,
            self.engine.tokenize, body.content, add_special=body.add_special, parse_special=body.parse_special
        )
        if not body.with_pieces:
            return JSONResponse({"tokens": tokens, "count": len(tokens)})
        pieces = await self.off_loop(context, self.engine.token_pieces, tokens)
        return JSONResponse({"tokens": [{"id": token, "piece": _piece(piece)} for token, piece in zip(tokens, pieces)],
                             "count": len(tokens)})

    async def detokenize(self, request: Request) -> JSONResponse:
        context = request_context(request)
        body = await self.read(request, DetokenizeRequest)
        for position, token in enumerate(body.tokens):
            self.check_token_ids([token], f"tokens.{position}")
        return JSONResponse({"content": await self.off_loop(context, self.engine.detokenize, body.tokens)})
