"""POST /v1/completions, OpenAI's legacy text completion: the prompt is raw text or token ids (no chat template),
one or several prompts (read as /completion reads them: serving/raw_prompts.py), `echo`, and the legacy logprobs
shape. With `suffix` (an insertion, as Continue and other editor plugins send it), each prompt is the text before
the cursor, laid out with the model's FIM tokens."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.protocol.openai_completions import CompletionRequest
from edge_llm.api.protocol.openai_answers import (
    StreamHead,
    TextCompletionAnswer,
    completion_choice,
    completion_chunk,
    completion_logprobs,
    new_completion_id,
    text_completion,
)
from edge_llm.api.request_context import request_context
from edge_llm.api.serving import raw_prompts
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.outcome import ChoiceResult, Generation, error_body, merged_timings
from edge_llm.api.sse import encode_json_event
from edge_llm.engine.types import Failed, Finished, TextDelta, TokenLogprob
from edge_llm.prompting.fim import cursor_line_split, infill_prompt, suffix_echo_stop

logger = logging.getLogger(__name__)


class CompletionServing(Serving):
    async def completions(self, request: Request) -> Response:
        context = request_context(request)
        completion = await self.read(request, CompletionRequest)
        self.check_logit_bias(completion.logit_bias)
        grammar = await self.off_loop(context, self.grammars.native, completion)
        if completion.suffix is not None:
            fim = self.fim_tokens("suffix")
            budget = completion.requested_max_tokens(self.defaults) or self.defaults.max_tokens
            texts = await raw_prompts.texts(self, context, completion.prompts)  # the text before the cursor
            prompts = [await self.off_loop(context, lambda parts=cursor_line_split(text): infill_prompt(
                self.plain_tokens, fim, prefix=parts[0], prompt=parts[1], suffix=completion.suffix or "",
                n_predict=budget, n_ctx=self.context_limit, bos=self.bos_token())) for text in texts]
        else:
            prompts = await raw_prompts.tokenized(self, context, completion.prompts)
            texts = await raw_prompts.texts(self, context, completion.prompts, prompts) if completion.echo else []
        echo = texts if completion.echo else [""] * len(prompts)
        generation = self.start(
            context,
            prompts,
            n=completion.n,
            max_tokens=completion.requested_max_tokens(self.defaults),
            sampling=lambda choice: completion.sampling_params(self.defaults, choice, grammar),
            stop=completion.stop_strings() + suffix_echo_stop(completion.suffix or ""),
            logprobs=completion.logprob_count,
            cache_prompt=completion.cache_prompt,
            speculative=completion.speculative,
            fill_in_the_middle=completion.suffix is not None,
        )
        if completion.stream:
            return self.stream(generation, self._completion_chunks(generation, echo, completion.include_usage))
        results = await self.collect(request, generation)
        return JSONResponse(self._completion_body(generation, results, echo), headers=self.headers(generation))

    def _completion_body(self, generation: Generation, results: list[ChoiceResult], echo: list[str]
                         ) -> TextCompletionAnswer:
        choices = []
        for index, result in enumerate(results):
            assert result.finished is not None
            prefix = echo[generation.prompt_of_choice[index]]
            choices.append(completion_choice(
                index, prefix + result.text, result.finished.reason.value,
                completion_logprobs(result.logprobs, len(prefix)) if generation.wants_logprobs else None))
        finished = [r.finished for r in results]
        return text_completion(_completion_id(), generation.model, choices, self.answer_usage(generation, finished),
                               merged_timings(finished))

    async def _completion_chunks(self, generation: Generation, echo: list[str], include_usage: bool
                                 ) -> AsyncIterator[bytes]:
        head = StreamHead(_completion_id(), int(time.time()), generation.model)
        want_logprobs = generation.wants_logprobs
        offsets = [len(echo[generation.prompt_of_choice[i]]) for i in range(len(generation.requests))]
        finished: list[Finished | None] = [None] * len(generation.requests)

        def chunk(index: int, text: str, finish_reason: str | None = None,
                  logprobs: list[TokenLogprob] | None = None, timings: dict[str, float] | None = None) -> bytes:
            return encode_json_event(completion_chunk(
                head, index, text, finish_reason,
                completion_logprobs(logprobs or [], offsets[index]) if want_logprobs else None, timings))

        for index in range(len(generation.requests)):
            prefix = echo[generation.prompt_of_choice[index]]
            if prefix:
                yield chunk(index, prefix)
        async for index, event in generation.channel.choice_events():
            if isinstance(event, TextDelta):
                yield chunk(index, event.text, logprobs=list(event.logprobs))
                offsets[index] += len(event.text)
            elif isinstance(event, Finished):
                finished[index] = event
                yield chunk(index, "", event.reason.value, timings=event.timings)
            elif isinstance(event, Failed):
                yield encode_json_event(error_body(event))
        yield self.stream_end(generation, finished, include_usage, head, "text_completion")


def _completion_id() -> str:
    return "cmpl-" + new_completion_id().removeprefix("chatcmpl-")
