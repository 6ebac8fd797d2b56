"""POST /v1/responses: OpenAI's Responses API.

The body (after the stored items `previous_response_id` continues) becomes the chat request it amounts to
(api/protocol/responses.py), so the model's core (its prompt builder and grammar cache, serving/core.py), chat's
grammar plan (text.format, a forced tool call: serving/chat.py `chat_plan`) and the tool-call tail
(serving/tool_calls.py) serve it unchanged; the answer goes out as a Response object or as the Responses event stream
(serving/responses_events.py), and is kept unless `store: false` (serving/stored_responses.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edge_llm.api.errors import CLIENT_CLOSED_REQUEST, APIError, invalid_request
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest
from edge_llm.api.params import report_ignored
from edge_llm.api.protocol.responses import FunctionToolChoice, ResponsesRequest, set_aside_unread
from edge_llm.api.protocol.llama_server_answers import PromptProgress, Timings, prompt_progress, timings
from edge_llm.api.protocol.responses_answers import response_error
from edge_llm.api.request_context import request_context
from edge_llm.api.serving.outcome import Generation, total_usage
from edge_llm.api.serving.background_responses import Run, background_runs, detached_events
from edge_llm.api.serving.base import Serving
from edge_llm.api.serving.chat import chat_plan
from edge_llm.api.serving.tool_calls import ToolCallTail
from edge_llm.api.serving.progress import MIN_INTERVAL_S, PrefillBeats
from edge_llm.api.serving.responses_events import Event, ResponseBuilder
from edge_llm.api.serving.stored_responses import Keeper, previous_context, stored_items
from edge_llm.api.sse import encode_json_event
from edge_llm.engine.types import Failed, FinishReason, Finished, PrefillProgress, TextDelta

logger = logging.getLogger(__name__)

_INCOMPLETE = {FinishReason.LENGTH: "max_output_tokens", FinishReason.TIMEOUT: "timeout"}


def refuse_unsupported(body: ResponsesRequest) -> None:
    """What a server without conversations or stored prompts cannot do, refused with the reason; a background
    response is stored and not streamed."""
    if body.conversation is not None:
        raise invalid_request("'conversation' is not supported: this server has no Conversations API; chain turns "
                              "with 'previous_response_id' or send the whole conversation in 'input'",
                              param="conversation", code="unsupported_parameter")
    if body.prompt is not None:
        raise invalid_request("'prompt' (a stored prompt template) is not supported: this server stores no prompts; "
                              "send 'instructions' and 'input'", param="prompt", code="unsupported_parameter")
    if body.background and body.stream:
        raise invalid_request("A background response cannot be streamed here: create it without 'stream' and "
                              "follow it with GET /v1/responses/{id}", param="stream", code="unsupported_parameter")
    if body.background and body.store is False:
        raise invalid_request("A background response must be stored: drop 'store': false", param="store")
    names = [tool.name for tool in body.tools or []]
    if not all(names):
        raise invalid_request("A function tool needs a 'name'", param="tools", code="missing_required_parameter")
    if isinstance(body.tool_choice, FunctionToolChoice) and body.tool_choice.name not in names:
        raise invalid_request(f"tool_choice names '{body.tool_choice.name}', which is not in tools",
                              param="tool_choice")
    if body.tool_choice == "required" and not names:
        raise invalid_request("tool_choice 'required' needs tools", param="tool_choice")


class ResponsesServing(Serving):
    """An OpenAI chat request underneath (the model's prompt builder, chat's grammar plan); the Responses shapes on
    top."""

    async def responses(self, request: Request) -> Response:
        context = request_context(request)
        raw = await self.json_body(request)
        report_ignored(context, set_aside_unread(raw))
        body = self.parse(context, ResponsesRequest, raw)
        self.check_model(body.model)
        refuse_unsupported(body)
        previous = previous_context(request, body)
        keeper = Keeper(request, [*previous, *stored_items(body)])
        if body.background and not keeper.store.enabled:
            raise invalid_request("Background responses need the response store: this server keeps none "
                                  "(--responses-store-entries 0)", param="background", code="unsupported_parameter")
        body = body.continued(previous) if previous else body
        chat = self.parse(context, ChatCompletionRequest, body.to_chat())
        plan = await self.off_loop(context, chat_plan, self.grammars, chat)
        tools = [tool.model_dump(exclude_none=True) for tool in chat.active_tools]
        try:
            prompt = await self.off_loop(context, self.chat_prompt, chat.to_messages(), tools or None)
            generation = self.start(
                context, [prompt], n=1, max_tokens=body.max_output_tokens,
                sampling=lambda choice: chat.sampling_params(self.defaults, choice, plan.grammar),
                stop=(), logprobs=None,
            )
        except APIError as error:
            if error.param == "messages":  # the Responses body calls its conversation `input`
                error.param = "input"
            raise
        stored = body.store is not False and keeper.store.enabled
        builder = ResponseBuilder(generation.model, {**body.echo(stored=stored), "background": bool(body.background)})
        tail = ToolCallTail(plan.tools)  # with the names: bare JSON calls count too
        if body.background:
            return await self._detached(request, generation, builder, tail, keeper)
        if stored:
            keeper.start(builder.response("in_progress"))
        if body.stream:
            telemetry = Telemetry(generation.prompt_lengths[0], per_token=body.timings_per_token)
            beats = PrefillBeats(
                lambda: encode(builder.still_in_progress(
                    telemetry.progress(beats.progress) if body.return_progress and beats.progress else None)),
                min_interval=0.0 if body.return_progress else MIN_INTERVAL_S)
            return self.stream(generation, self._events(generation, builder, tail, keeper if stored else None, beats,
                                                        telemetry), beats=beats)
        try:
            result = (await self.collect(request, generation))[0]
        except APIError as error:
            if stored:
                keeper.end(builder.response("cancelled" if error.status == CLIENT_CLOSED_REQUEST else "failed",
                                            error=None if error.status == CLIENT_CLOSED_REQUEST
                                            else response_error(error.message, error.status)))
            raise
        assert result.finished is not None
        answer_events(builder, tail, result.text)
        final = finish_events(builder, tail, generation, result.finished)[-1]["response"]
        if stored:
            keeper.end(final)
        return JSONResponse(final, headers=self.headers(generation))

    async def _detached(self, request: Request, generation: Generation, builder: ResponseBuilder,
                        tail: ToolCallTail, keeper: Keeper) -> Response:
        """A background response: stored `queued` and answered at once; the run goes on without the request."""
        queued = builder.response("queued")
        keeper.start(queued)
        try:
            lease = await request.app.state.registry.acquire(self.model_id)
        except BaseException:
            self.abort(generation)
            keeper.end(builder.response("failed", error=response_error("the model went away")))
            raise
        run = Run(generation, builder, keeper, self.abort, lease)
        background_runs(request).start(run, detached_events(tail, finish_events, answer_events))
        return JSONResponse(queued, headers=self.headers(generation))

    async def _events(self, generation: Generation, builder: ResponseBuilder, tail: ToolCallTail,
                      keeper: Keeper | None, beats: PrefillBeats, telemetry: Telemetry) -> AsyncIterator[bytes]:
        try:
            for event in builder.start():
                yield encode(event)
            beats.arm()
            async for _, engine_event in generation.channel.choice_events():
                beats.stop()
                if isinstance(engine_event, TextDelta):
                    events = answer_events(builder, tail, engine_event.text)
                    if telemetry.per_token:  # timed from the first token, even one held back (whitespace)
                        so_far = telemetry.so_far(engine_event.token_count)
                        if events:
                            events[-1]["timings"] = so_far
                elif isinstance(engine_event, Finished):
                    events = finish_events(builder, tail, generation, engine_event)
                    events[-1]["timings"] = telemetry.final(engine_event)
                elif isinstance(engine_event, Failed):
                    events = builder.failed(engine_event.message)
                else:
                    continue
                if keeper is not None and events and "response" in events[-1] and events[-1]["type"] in _ENDS:
                    keeper.end(events[-1]["response"])
                for event in events:
                    yield encode(event)
        finally:
            if keeper is not None and not keeper.ended:  # the client left before the end
                keeper.end(builder.response("cancelled"))


_ENDS = ("response.completed", "response.incomplete", "response.failed")


class Telemetry:
    """llama-server's telemetry in one Responses stream, in its shapes: `prompt_progress` for an engine's prefill
    report, `timings` so far for a delta (`timings_per_token`) and the answer's own at the end (the engine's prefill
    and decode times). The engine reports its times only at the end, so a delta's are measured here: its prompt time
    from the request's start to the first delta (queueing included), its decode time from the first delta on."""

    def __init__(self, prompt_tokens: int, *, per_token: bool) -> None:
        self.per_token = per_token
        self._prompt_tokens = prompt_tokens
        self._started = time.monotonic()
        self._first_delta: float | None = None
        self._cached = 0

    def progress(self, step: PrefillProgress) -> PromptProgress:
        self._cached = step.cached
        return prompt_progress(total=step.total, cached=step.cached, processed=step.processed,
                               elapsed_s=time.monotonic() - self._started)

    def so_far(self, predicted: int) -> Timings:
        now = time.monotonic()
        if self._first_delta is None:
            self._first_delta = now
        engine = {"prefill_ms": (self._first_delta - self._started) * 1000,
                  "decode_ms": (now - self._first_delta) * 1000}
        return timings(cached=self._cached, prompt_tokens=self._prompt_tokens, predicted=predicted, engine=engine)

    @staticmethod
    def final(finished: Finished) -> Timings:
        usage = finished.usage
        return timings(cached=usage.cached_tokens, prompt_tokens=usage.prompt_tokens,
                       predicted=usage.completion_tokens, engine=finished.timings)


def answer_events(builder: ResponseBuilder, tail: ToolCallTail, text: str) -> list[Event]:
    """The events for a piece of the answer: its text, and any tool call completed in it."""
    content, calls = tail.feed(text)
    events = builder.text(content)
    for call in calls:
        events += builder.tool_call(call)
    return events


def finish_events(builder: ResponseBuilder, tail: ToolCallTail, generation: Generation,
                  finished: Finished) -> list[Event]:
    """What the tail still held, then the end; the last event carries the final Response."""
    rest, calls = tail.finish()
    events = builder.text(rest)
    for call in calls:
        events += builder.tool_call(call)
    usage = total_usage(generation, [finished])
    return events + builder.finish(usage, incomplete_reason=_INCOMPLETE.get(finished.reason))


def encode(event: Event) -> bytes:
    """An SSE event named by its type (the Responses stream has no [DONE])."""
    return encode_json_event(event, event=event["type"])
