"""llama-server's own routes beside /infill: POST /completion (llama.vim, llama-server's web UI and countless
scripts) and GET /props (what its clients read to learn the model, the context and the template).

/completion is /infill without the fill-in-the-middle layout: a raw prompt (text, token ids, or both mixed, as
llama-server's `tokenize_mixed` reads it: text with its control-token spellings, a BOS first when the model adds
one), `grammar` / `json_schema`, and llama-server's answer and stream (InfillServing.answer).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from edge_llm import __version__
from edge_llm.api.protocol.llama_server import NativeCompletionRequest
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.outcome import engine_unavailable
from edge_llm.api.serving.infill import InfillServing
from edge_llm.engine.types import EngineUnavailableError

logger = logging.getLogger(__name__)


class NativeServing(InfillServing):
    async def completion(self, request: Request) -> Response:
        context = request_context(request)
        body = await self.read(request, NativeCompletionRequest)
        grammar = await self.off_loop(context, self.grammars.native, body)
        prompt = await self.off_loop(context, self._prompt_tokens, body.prompt)
        generation = self.start(context, [prompt], n=1, max_tokens=body.requested_max_tokens(),
                                sampling=lambda _: body.sampling_params(self.defaults, grammar),
                                stop=tuple(body.stop), logprobs=body.logprobs, cache_prompt=body.cache_prompt,
                                speculative=body.speculative)
        text = (body.prompt if isinstance(body.prompt, str)
                else await self.off_loop(context, self.engine.detokenize, prompt))
        return await self.answer(request, generation, body, text)

    def _prompt_tokens(self, prompt: str | list[int | str]) -> list[int]:
        """llama-server's tokenize_mixed: pieces of text (control-token spellings read as the tokens, the caller's
        intent on this raw route) and token ids, in order; the model's BOS before the first piece of text."""
        pieces = [prompt] if isinstance(prompt, str) else prompt
        self.check_prompt_bytes(sum(len(piece.encode("utf-8", errors="replace")) for piece in pieces
                                    if isinstance(piece, str)))
        tokens: list[int] = []
        for index, piece in enumerate(pieces):
            if isinstance(piece, str):
                tokens.extend(self.engine.tokenize(piece, add_special=index == 0, parse_special=True))
            else:
                self.check_token_ids([piece], f"prompt.{index}")
                tokens.append(piece)
        return tokens

    def props(self) -> dict[str, Any]:
        """The fields llama-server's /props answers that its clients read."""
        info = self.engine.model_info
        if info is None:
            raise engine_unavailable(EngineUnavailableError("the model is not loaded yet"))
        defaults = self.defaults
        return {
            "default_generation_settings": {
                "n_ctx": self.context_limit,
                "params": {"temperature": defaults.temperature, "top_p": defaults.top_p, "top_k": defaults.top_k,
                           "n_predict": defaults.max_tokens, "seed": -1, "stream": False,
                           "cache_prompt": True, "samplers": ["top_k", "top_p", "min_p", "temperature"]},
            },
            "total_slots": self.settings.parallel,
            "model_alias": self.settings.model_alias or self.model_id,
            "model_path": str(info.path),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": False,
            "endpoint_props": True,
            "endpoint_metrics": True,
            "chat_template": info.chat_template or "",
            "bos_token": info.bos_text,
            "eos_token": info.eos_text,
            "build_info": f"edge-llm {__version__}",
            "is_sleeping": False,
        }
