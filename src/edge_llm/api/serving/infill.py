"""POST /infill, llama-server's fill-in-the-middle endpoint for editors (llama.vscode, llama.vim).

The prompt is laid out with the model's own FIM tokens (prompting/fim.py); the answer is llama-server's
completion shape (`content`, `stop`, `tokens_predicted`, `tokens_cached`, `timings`, …), streamed as `data:`
events of the same shape without a `[DONE]`, as llama-server does. The editor rules `n_indent` and
`t_max_predict_ms` end a completion early; the engine request is then aborted like a disconnect.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.protocol.llama_server import InfillRequest, NativeGeneration
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.outcome import Generation, error_body, failure_error
from edge_llm.api.sse import encode_json_event
from edge_llm.api.protocol.common import SamplingDefaults
from edge_llm.engine.types import Failed, Finished, FinishReason, PrefillProgress, TextDelta, TokenLogprob
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
        generation = self.start(context, [prompt], n=1, max_tokens=max_tokens,
                                sampling=lambda _: body.sampling_params(self.defaults),
                                stop=tuple(body.stop) + suffix_echo_stop(body.input_suffix), logprobs=body.logprobs,
                                cache_prompt=body.cache_prompt, fill_in_the_middle=True,
                                speculative=body.speculative)
        text = await self.off_loop(context, self.engine.detokenize, prompt)
        return await self.answer(request, generation, body, text)

    async def answer(self, request: Request, generation: Generation, body: NativeGeneration,
                     prompt: str) -> Response:
        """llama-server's answer to its own routes: streamed `data:` events or one object, the editor rules
        (`n_indent`, `t_max_predict_ms`) applied; `prompt` is the prompt's text, echoed in the final object."""
        headers = self.headers(generation)
        cut = EditorCut(body.n_indent, body.t_max_predict_ms, body.input_suffix)
        if body.stream:
            response = self.stream(generation, self._events(generation, body, cut, prompt), headers=headers)
            if body.return_progress:
                started = time.monotonic()
                generation.channel.on_progress = lambda _, step: response.send_aside(
                    encode_json_event(_progress_chunk(generation, step, started)))
            return response
        progress = await self.while_connected(request, generation, self._drain(generation, body, cut))
        return JSONResponse(self._final(generation, body, progress, prompt), headers=headers)

    # ---- the answer as it streams ---------------------------------------------------------------

    async def _pieces(self, generation: Generation, body: NativeGeneration, cut: EditorCut,
                      progress: _Progress) -> AsyncIterator[tuple[str, list[TokenLogprob]]]:
        """The content as it may be sent, after the editor rules, with the tokens behind it (those of text the
        rules hold back go with the text when it is sent); `progress` has how it ended."""
        started = 0.0  # the first token's arrival: t_max_predict_ms counts generation time, as llama-server does
        held: list[TokenLogprob] = []
        async for _, event in generation.channel.choice_events():
            if isinstance(event, TextDelta):
                if body.warm_only or progress.cut:
                    continue  # after a cut: the engine's Finished (with usage and timings) is on its way
                progress.tokens = event.token_count
                held.extend(event.logprobs)
                started = started or time.monotonic()
                text = cut.feed(event.text, (time.monotonic() - started) * 1000)
                if text:
                    progress.content.append(text)
                    progress.sent.extend(held)
                    yield text, held
                    held = []
                if cut.cut:
                    progress.cut = True
                    self.abort(generation)
            elif isinstance(event, Finished):
                progress.finished = event
                tail = "" if body.warm_only or progress.cut else cut.finish()
                if tail:
                    progress.content.append(tail)
                    progress.sent.extend(held)
                    yield tail, held
                return
            elif isinstance(event, Failed):
                raise _Failure(event)

    async def _drain(self, generation: Generation, body: NativeGeneration, cut: EditorCut) -> _Progress:
        progress = _Progress()
        try:
            async for _ in self._pieces(generation, body, cut, progress):
                pass
        except _Failure as failure:
            self.abort(generation)
            raise failure_error(failure.failed) from None
        return progress

    async def _events(self, generation: Generation, body: NativeGeneration, cut: EditorCut,
                      prompt: str) -> AsyncIterator[bytes]:
        progress = _Progress()
        prompt_tokens = generation.prompt_lengths[0]
        try:
            async for text, tokens in self._pieces(generation, body, cut, progress):
                chunk = {"index": 0, "content": text, "tokens": [token.token for token in tokens] if body.return_tokens
                         else [], "stop": False, "id_slot": -1, "tokens_predicted": progress.tokens,
                         "tokens_evaluated": prompt_tokens}
                if body.n_probs:
                    chunk["completion_probabilities"] = token_probabilities(tokens, body.post_sampling_probs)
                yield encode_json_event(chunk)
        except _Failure as failure:
            yield encode_json_event(error_body(failure.failed))
            return
        yield encode_json_event(self._final(generation, body, progress, prompt, streamed=True))

    def _final(self, generation: Generation, body: NativeGeneration, progress: _Progress, prompt: str, *,
               streamed: bool = False) -> dict[str, Any]:
        finished = progress.finished
        prompt_tokens = generation.prompt_lengths[0]
        cached = finished.usage.cached_tokens if finished is not None else 0
        predicted = 0 if body.warm_only else progress.tokens
        timings = finished.timings if finished is not None else {}
        prompt_ms = float(timings.get("prefill_ms", 0.0))
        predicted_ms = float(timings.get("decode_ms", 0.0))
        result = {
            "index": 0,
            "content": "" if streamed else "".join(progress.content),
            "tokens": [token.token for token in progress.sent] if body.return_tokens and not streamed else [],
            "id_slot": -1,
            "stop": True,
            "model": self.settings.model_alias or self.model_id,  # llama-server's --alias names the model
            "tokens_predicted": predicted,
            "tokens_evaluated": prompt_tokens,
            "has_new_line": "\n" in "".join(progress.content),
            "truncated": False,
            "stop_type": _stop_type(finished, progress.cut),
            "stopping_word": finished.stop_sequence or "" if finished is not None and not progress.cut else "",
            "generation_settings": generation_settings(body, self.defaults, self.context_limit),
            "prompt": prompt,
            "tokens_cached": cached,
            "timings": {
                "cache_n": cached,
                "prompt_n": prompt_tokens - cached,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(prompt_tokens - cached, 1),
                "prompt_per_second": (prompt_tokens - cached) / (prompt_ms / 1000) if prompt_ms else 0.0,
                "predicted_n": predicted,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(predicted, 1),
                "predicted_per_second": predicted / (predicted_ms / 1000) if predicted_ms else 0.0,
            },
        }
        for key in ("draft_n", "draft_n_accepted"):  # speculative decoding, as llama-server reports it
            if key in timings:
                result["timings"][key] = timings[key]
        if body.n_probs and not streamed:  # a stream sent them with each piece
            result["completion_probabilities"] = token_probabilities(progress.sent, body.post_sampling_probs)
        if not body.response_fields:
            return result
        selected = _select(result, body.response_fields)
        return {**selected, "stop": True} if streamed else selected  # a stream's end stays recognisable


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


def _progress_chunk(generation: Generation, step: PrefillProgress, started: float) -> dict[str, Any]:
    """llama-server's `return_progress` chunk: a partial result without content, with the prompt's progress."""
    return {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": -1, "tokens_predicted": 0,
            "tokens_evaluated": generation.prompt_lengths[0],
            "prompt_progress": {"total": step.total, "cache": step.cached, "processed": step.processed,
                                "time_ms": (time.monotonic() - started) * 1000}}


def token_probabilities(tokens: list[TokenLogprob], post_sampling: bool) -> list[dict[str, Any]]:
    """llama-server's `completion_probabilities`: each token with its logprob and the likeliest alternatives
    (`prob` / `top_probs` as probabilities when `post_sampling_probs`; computed before sampling all the same)."""

    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        value = math.exp(logprob) if post_sampling else max(logprob, _LOWEST)
        return {"id": token, "token": piece.decode("utf-8", errors="ignore"), "bytes": list(piece),
                "prob" if post_sampling else "logprob": value}

    return [{**entry(item.token, item.piece, item.logprob),
             "top_probs" if post_sampling else "top_logprobs": [entry(*alternative) for alternative in item.top]}
            for item in tokens]


_LOWEST = -3.4028234663852886e38  # llama-server's stand-in for log(0), which JSON cannot spell


def generation_settings(body: NativeGeneration, defaults: SamplingDefaults, n_ctx: int) -> dict[str, Any]:
    """llama-server's `generation_settings`: the settings this answer was generated with."""
    sampling = body.sampling_params(defaults)
    max_tokens = body.requested_max_tokens()
    return {"n_ctx": n_ctx, "n_predict": -1 if max_tokens is None else max_tokens,
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty,
            "seed": -1 if sampling.seed is None else sampling.seed, "stop": list(body.stop), "stream": body.stream,
            "cache_prompt": body.cache_prompt, "n_indent": body.n_indent, "t_max_predict_ms": body.t_max_predict_ms,
            "speculative": body.speculative, "samplers": ["top_k", "top_p", "min_p", "temperature"]}


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

