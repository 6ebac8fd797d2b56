"""Background Responses (`background: true`): the answer runs detached from the request, which gets the stored
response `queued` at once; `GET /v1/responses/{id}` then shows it `in_progress` (from the engine's first event) and
its end, and `POST /v1/responses/{id}/cancel` stops the generation and leaves it `cancelled`.

A run holds its own lease on the model (the request's ends with the request), so the model is not unloaded under
it; the runs are kept by response id in `app.state.background_runs` until they end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.errors import invalid_request
from edge_llm.api.protocol.responses_answers import response_error
from edge_llm.api.response_store import request_owner
from edge_llm.api.serving.outcome import Generation
from edge_llm.api.serving.responses_events import ResponseBuilder
from edge_llm.api.serving.stored_responses import Keeper, not_found, response_store
from edge_llm.api.serving.tool_calls import ToolCallTail
from edge_llm.engine.types import EngineEvent, Failed, Finished, TextDelta
from edge_llm.registry.registry import Lease

logger = logging.getLogger(__name__)

_ENDED = ("completed", "incomplete", "failed", "cancelled")


@dataclass(eq=False)
class Run:
    generation: Generation
    builder: ResponseBuilder
    keeper: Keeper
    abort: Callable[[Generation], None]
    lease: Lease
    task: asyncio.Task[None] | None = field(default=None)

    def cancel(self) -> None:
        """Stops the generation and keeps the response `cancelled` with what it had written (idempotent)."""
        if not self.keeper.ended:
            self.abort(self.generation)
            self.keeper.end(self.builder.response("cancelled"))
        if self.task is not None:
            self.task.cancel()


class BackgroundRuns:
    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def start(self, run: Run, events: Callable[[Run, EngineEvent], dict[str, object] | None]) -> None:
        """`events(run, engine_event)`: the final Response when the event ends the answer, else None."""
        response_id = run.builder.response_id
        self._runs[response_id] = run
        run.task = asyncio.get_running_loop().create_task(self._follow(run, events), name=f"background {response_id}")

    def get(self, response_id: str) -> Run | None:
        return self._runs.get(response_id)

    async def _follow(self, run: Run, events: Callable[[Run, EngineEvent], dict[str, object] | None]) -> None:
        started = False
        try:
            async for _, engine_event in run.generation.channel.choice_events():
                if not started and not run.keeper.ended:
                    started = True
                    run.keeper.store.update(run.builder.response("in_progress"))
                final = events(run, engine_event)
                if final is not None and not run.keeper.ended:
                    run.keeper.end(final)
        except asyncio.CancelledError:
            pass
        except Exception:  # an unexpected failure ends this response only
            logger.exception("background response %s failed", run.builder.response_id)
            if not run.keeper.ended:
                run.keeper.end(run.builder.response("failed", error=response_error("the answer failed")))
        finally:
            if not run.keeper.ended:  # shut down before the end
                run.abort(run.generation)
                run.keeper.end(run.builder.response("cancelled"))
            run.lease.release()
            self._runs.pop(run.builder.response_id, None)


def background_runs(request: Request) -> BackgroundRuns:
    return cast(BackgroundRuns, request.app.state.background_runs)


def cancel(request: Request, response_id: str) -> JSONResponse:
    """OpenAI's cancel: only a background response can be cancelled; cancelling one that has ended answers it as
    it ended (idempotent)."""
    entry = response_store(request).get(request_owner(request), response_id)
    if entry is None:
        raise not_found(response_id)
    if not entry.response.get("background"):
        raise invalid_request("Cannot cancel a synchronous response.", code="invalid_request")
    run = background_runs(request).get(response_id)
    if run is not None and entry.response.get("status") not in _ENDED:
        run.cancel()
        logger.info("background response %s cancelled", response_id)
    entry = response_store(request).get(request_owner(request), response_id)
    if entry is None:  # dropped from the store meanwhile
        raise not_found(response_id)
    return JSONResponse(entry.response)


def detached_events(tail: ToolCallTail, finish: Callable[..., list[dict[str, object]]],
                    answer: Callable[..., list[dict[str, object]]]
                    ) -> Callable[[Run, EngineEvent], dict[str, object] | None]:
    """What a run does with each engine event: the text and tool calls into its builder; the final Response at
    the end."""

    def on_event(run: Run, engine_event: EngineEvent) -> dict[str, object] | None:
        if isinstance(engine_event, TextDelta):
            answer(run.builder, tail, engine_event.text)
        elif isinstance(engine_event, Finished):
            return finish(run.builder, tail, run.generation, engine_event)[-1]["response"]  # type: ignore[return-value]
        elif isinstance(engine_event, Failed):
            return run.builder.failed(engine_event.message)[-1]["response"]  # type: ignore[return-value]
        return None

    return on_event


__all__ = ["BackgroundRuns", "Run", "background_runs", "cancel", "detached_events"]
