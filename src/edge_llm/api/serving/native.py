"""llama-server's own routes beside /infill: POST /completion (llama.vim, llama-server's web UI and countless
scripts), GET /props (what its clients read to learn the model, the context and the template) and
POST /apply-template (the chat template applied, as text).

/completion is /infill without the fill-in-the-middle layout: raw prompts (text, token ids, or both mixed, as
llama-server's `tokenize_mixed` reads them: text with its control-token spellings, a BOS first when the model adds
one; several prompts are answered one each, as a list), `grammar` / `json_schema`, and llama-server's answer and
stream (InfillServing.answer).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm import __version__
from edge_llm.api.protocol.llama_server import NativeCompletionRequest
from edge_llm.api.protocol.llama_server_answers import SAMPLERS, Props, applied_template, props
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest
from edge_llm.api.request_context import request_context
from edge_llm.api.serving import raw_prompts
from edge_llm.api.serving.outcome import engine_unavailable
from edge_llm.api.serving.infill import InfillServing
from edge_llm.engine.types import EngineUnavailableError

logger = logging.getLogger(__name__)


class NativeServing(InfillServing):
    async def completion(self, request: Request) -> Response:
        context = request_context(request)
        body = await self.read(request, NativeCompletionRequest)
        grammar = await self.off_loop(context, self.grammars.native, body)
        prompts = await raw_prompts.tokenized(self, context, body.prompts)
        bias = await self.logit_bias(context, body)
        sampling = replace(body.sampling_params(self.defaults, grammar), logit_bias=bias)
        generation = self.start(context, prompts, n=1, max_tokens=body.requested_max_tokens(),
                                sampling=lambda _: sampling,
                                stop=tuple(body.stop), logprobs=body.logprobs, cache_prompt=body.cache_prompt,
                                speculative=body.speculative)
        texts = await raw_prompts.texts(self, context, body.prompts, prompts)
        return await self.answer(request, generation, body, texts)

    async def apply_template(self, request: Request) -> JSONResponse:
        """llama-server's /apply-template: the chat body's messages (and tools) through the model's chat template,
        the generation prompt added, as the text the chat route would tokenize."""
        context = request_context(request)
        chat = await self.read(request, ChatCompletionRequest)
        tools = [tool.model_dump(exclude_none=True) for tool in chat.active_tools]
        text = await self.off_loop(context, self.core.chat_text, chat.to_messages(), tools or None)
        return JSONResponse(applied_template(text))

    def props(self) -> Props:
        """The fields llama-server's /props answers that its clients read."""
        info = self.engine.model_info
        if info is None:
            raise engine_unavailable(EngineUnavailableError("the model is not loaded yet"))
        defaults = self.defaults
        params = {"temperature": defaults.temperature, "top_p": defaults.top_p, "top_k": defaults.top_k,
                  "n_predict": defaults.max_tokens, "seed": self.settings.seed, "stream": False, "cache_prompt": True,
                  "samplers": list(SAMPLERS)}
        return props(n_ctx=self.context_limit, params=params, total_slots=self.settings.parallel,
                     model_alias=self.first_alias, model_path=str(info.path),
                     chat_template=self.core.chat_template or info.chat_template or "",  # --chat-template first
                     bos_token=info.bos_text, eos_token=info.eos_text,
                     build_info=f"edge-llm {__version__}")
