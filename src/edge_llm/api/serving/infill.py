"""POST /infill, llama-server's fill-in-the-middle endpoint for editors (llama.vscode, llama.vim).

The prompt is laid out with the model's own FIM tokens (prompting/fim.py); the answer is llama-server's
completion shape (`content`, `stop`, `tokens_predicted`, `tokens_cached`, `timings`, …), streamed as `data:`
events of the same shape without a `[DONE]`, as llama-server does. The editor rules `n_indent` and
`t_max_predict_ms` end a completion early; the engine request is then aborted like a disconnect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.protocol.llama_server import InfillRequest, NativeGeneration, bias_entries
from edge_llm.api.protocol import llama_server_answers
from edge_llm.api.protocol.llama_server_answers import (
    CompletionChunk,
    GenerationSettings,
    completion_chunk,
    completion_final,
    prompt_progress,
    timings,
    token_probabilities,
)
from edge_llm.api.request_context import RequestContext, request_context
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.outcome import Generation, error_body, failure_error
from edge_llm.api.sse import encode_json_event
from edge_llm.engine.types import (Failed, Finished, FinishReason, PrefillProgress, SamplingParams, TextDelta,
                                   TokenLogprob)
from edge_llm.prompting.fim import EditorCut, ExtraFile, infill_prompt, suffix_echo_stop

logger = logging.getLogger(__name__)


@dataclass
class _Progress:
    """One infill answer as it streams: what was sent, how it ended."""

    content: list[str] = field(default_factory=list)
    tokens: int = 0
    sent: list[TokenLogprob] = field(default_factory=list)  # the tokens behind the content (return_tokens, n_probs)
    finished: Finished | None = None
    cut: bool = False


class InfillServing(Serving):
    async def infill(self, request: Request) -> Response:
        context = request_context(request)
        body = await self.read(request, InfillRequest)
        fim = self.fim_tokens("input_prefix")
        max_tokens = body.requested_max_tokens()
        n_predict = max_tokens if max_tokens is not None else self.settings.default_max_tokens
        extra = [ExtraFile(chunk.filename, chunk.text) for chunk in body.input_extra]
        prompt = await self.off_loop(context,
            lambda: infill_prompt(self.plain_tokens, fim, prefix=body.input_prefix, suffix=body.input_suffix,
                                  prompt=body.prompt, extra=extra, n_predict=n_predict, n_ctx=self.context_limit,
                                  bos=self.bos_token()))
        bias = await self.logit_bias(context, body)
        generation = self.start(context, [prompt], n=1, max_tokens=max_tokens,
                                sampling=lambda _: replace(body.sampling_params(self.defaults), logit_bias=bias),
                                stop=tuple(body.stop) + suffix_echo_stop(body.input_suffix), logprobs=body.logprobs,
                                cache_prompt=body.cache_prompt, fill_in_the_middle=True,
                                speculative=body.speculative)
        text = await self.off_loop(context, self.engine.detokenize, prompt)
        return await self.answer(request, generation, body, [text])

    async def logit_bias(self, context: RequestContext, body: NativeGeneration) -> tuple[tuple[int, float], ...]:
        """llama-server's logit_bias as token ids: a text's every token (plain text, no BOS), ids outside the
        vocabulary left out, as llama-server does."""
        entries = bias_entries(body.logit_bias)
        if not entries:
            return ()
        n_vocab = self.engine.n_vocab

        def resolve() -> tuple[tuple[int, float], ...]:
            pairs: list[tuple[int, float]] = []
            for key, bias in entries:
                if isinstance(key, str):
                    pairs.extend((token, bias) for token in self.plain_tokens(key))
                elif 0 <= key < n_vocab:
                    pairs.append((key, bias))
            return tuple(pairs)

        return await self.off_loop(context, resolve)

    @property
    def first_alias(self) -> str:
        """The `model` llama-server's answers name: the first --alias (llama-server's), else the model's id."""
        aliases = self.settings.alias_names
        return aliases[0] if aliases else self.model_id

    async def answer(self, request: Request, generation: Generation, body: NativeGeneration,
                     prompts: list[str]) -> Response:
        """llama-server's answer to its own routes: streamed `data:` events (each with its prompt's `index`) or one
        object (a list of them for several prompts, as llama-server), the editor rules (`n_indent`,
        `t_max_predict_ms`) applied to each; `prompts` are the prompts' texts, echoed in the final objects."""
        headers = self.headers(generation)
        cuts = [EditorCut(body.n_indent, body.t_max_predict_ms, body.input_suffix) for _ in generation.requests]
        if body.stream:
            response = self.stream(generation, self._events(generation, body, cuts, prompts), headers=headers)
            if body.return_progress:
                started = time.monotonic()
                generation.channel.on_progress = lambda index, step: response.send_aside(
                    encode_json_event(_progress_chunk(generation, index, step, started)))
            return response
        progress = await self.while_connected(request, generation, self._drain(generation, body, cuts))
        finals = [self._final(generation, body, index, done, prompts) for index, done in enumerate(progress)]
        return JSONResponse(finals[0] if len(finals) == 1 else finals, headers=headers)

    # ---- the answer as it streams ---------------------------------------------------------------

    async def _pieces(self, generation: Generation, body: NativeGeneration, cuts: list[EditorCut],
                      progress: list[_Progress]) -> AsyncIterator[tuple[int, str | None, list[TokenLogprob]]]:
        """(choice, content as it may be sent after the editor rules, the tokens behind it) — those of text the
        rules hold back go with the text when it is sent; (choice, None, []) when that choice has ended (its
        `progress` says how)."""
        started = [0.0] * len(cuts)  # each first token's arrival: t_max_predict_ms counts generation time
        held: list[list[TokenLogprob]] = [[] for _ in cuts]
        async for index, event in generation.channel.choice_events():
            done, cut = progress[index], cuts[index]
            if isinstance(event, TextDelta):
                if body.warm_only or done.cut:
                    continue  # after a cut: the engine's Finished (with usage and timings) is on its way
                done.tokens = event.token_count
                held[index].extend(event.logprobs)
                started[index] = started[index] or time.monotonic()
                text = cut.feed(event.text, (time.monotonic() - started[index]) * 1000)
                if text:
                    done.content.append(text)
                    done.sent.extend(held[index])
                    yield index, text, held[index]
                    held[index] = []
                if cut.cut:
                    done.cut = True
                    self.engine.abort(generation.requests[index].request_id)
            elif isinstance(event, Finished):
                done.finished = event
                tail = "" if body.warm_only or done.cut else cut.finish()
                if tail:
                    done.content.append(tail)
                    done.sent.extend(held[index])
                    yield index, tail, held[index]
                yield index, None, []
            elif isinstance(event, Failed):
                raise _Failure(event)

    async def _drain(self, generation: Generation, body: NativeGeneration, cuts: list[EditorCut]
                     ) -> list[_Progress]:
        progress = [_Progress() for _ in cuts]
        try:
            async for _ in self._pieces(generation, body, cuts, progress):
                pass
        except _Failure as failure:
            self.abort(generation)
            raise failure_error(failure.failed) from None
        return progress

    async def _events(self, generation: Generation, body: NativeGeneration, cuts: list[EditorCut],
                      prompts: list[str]) -> AsyncIterator[bytes]:
        progress = [_Progress() for _ in cuts]
        try:
            async for index, text, tokens in self._pieces(generation, body, cuts, progress):
                if text is None:
                    yield encode_json_event(self._final(generation, body, index, progress[index], prompts,
                                                        streamed=True))
                    continue
                yield encode_json_event(completion_chunk(
                    index, text, [token.token for token in tokens] if body.return_tokens else [],
                    predicted=progress[index].tokens, evaluated=_prompt_length(generation, index),
                    probabilities=token_probabilities(tokens, body.post_sampling_probs) if body.n_probs else None))
        except _Failure as failure:
            yield encode_json_event(error_body(failure.failed))

    def _end_tokens(self) -> tuple[int, ...]:
        info = self.engine.model_info
        return info.end_tokens if info is not None else ()

    def _final(self, generation: Generation, body: NativeGeneration, index: int, progress: _Progress,
               prompts: list[str], *, streamed: bool = False) -> dict[str, Any]:
        finished = progress.finished
        prompt_tokens = _prompt_length(generation, index)
        cached = finished.usage.cached_tokens if finished is not None else 0
        predicted = 0 if body.warm_only else progress.tokens
        content = "".join(progress.content)
        result = completion_final(
            index, "" if streamed else content,
            [token.token for token in progress.sent] if body.return_tokens and not streamed else [],
            model=self.first_alias,
            predicted=predicted, evaluated=prompt_tokens,
            settings=generation_settings(body, generation.requests[index].sampling, self.context_limit,
                                         self._end_tokens()),
            prompt=prompts[generation.prompt_of_choice[index]], has_new_line="\n" in content,
            stop_type=_stop_type(finished, progress.cut),
            stopping_word=finished.stop_sequence or "" if finished is not None and not progress.cut else "",
            cached=cached,
            answer_timings=timings(cached=cached, prompt_tokens=prompt_tokens, predicted=predicted,
                                   engine=finished.timings if finished is not None else {}),
            # a stream sent them with each piece
            probabilities=token_probabilities(progress.sent, body.post_sampling_probs)
            if body.n_probs and not streamed else None)
        if not body.response_fields:
            return dict(result)
        selected = _select(dict(result), body.response_fields)
        return {**selected, "stop": True} if streamed else selected  # a stream's end stays recognisable


def _prompt_length(generation: Generation, choice: int) -> int:
    return generation.prompt_lengths[generation.prompt_of_choice[choice]]


class _Failure(Exception):
    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.message)
        self.failed = failed


def _stop_type(finished: Finished | None, cut: bool) -> str:
    """llama-server's stop types: the editor rules' cuts count as its limits, as there."""
    if cut or finished is None:
        return "limit"
    if finished.reason == FinishReason.STOP:
        return "word" if finished.stop_sequence else "eos"
    return "limit" if finished.reason == FinishReason.LENGTH else "none"


def _progress_chunk(generation: Generation, index: int, step: PrefillProgress, started: float) -> CompletionChunk:
    """llama-server's `return_progress` chunk: a partial result without content, with the prompt's progress."""
    return completion_chunk(index, "", [], predicted=0, evaluated=_prompt_length(generation, index),
                            progress=prompt_progress(total=step.total, cached=step.cached, processed=step.processed,
                                                     elapsed_s=time.monotonic() - started))


def generation_settings(body: NativeGeneration, sampling: SamplingParams, n_ctx: int,
                        end_tokens: tuple[int, ...]) -> GenerationSettings:
    """llama-server's `generation_settings`: the settings this answer was generated with (`sampling`: the request's
    own, as the engine ran it)."""
    return llama_server_answers.generation_settings(
        n_ctx=n_ctx, max_tokens=body.requested_max_tokens(), temperature=sampling.temperature, top_k=sampling.top_k,
        top_p=sampling.top_p, min_p=sampling.min_p, repeat_penalty=sampling.repeat_penalty, seed=sampling.seed,
        stop=list(body.stop), stream=body.stream, cache_prompt=body.cache_prompt, n_indent=body.n_indent,
        t_max_predict_ms=body.t_max_predict_ms, speculative=body.speculative,
        logit_bias=sampling.logit_bias, banned_tokens=end_tokens if sampling.ignore_eos else ())


def _select(result: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """llama-server's `response_fields`: only the named fields, nested ones by `a/b` paths, under those names."""
    selected: dict[str, Any] = {}
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            selected[path] = value
    return selected

