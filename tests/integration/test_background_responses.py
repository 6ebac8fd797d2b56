"""Background Responses with the openai SDK: `background=True` answers at once with the stored response queued, the
answer runs detached and `retrieve` shows it end; `cancel` stops a running one (its status becomes cancelled and it
writes no more); cancelling a response made without background is OpenAI's 400."""

from __future__ import annotations

import openai
import pytest

from edge_llm.testing.server import RunningServer
from tests.helpers import wait_for

ENDED = ("completed", "incomplete", "failed", "cancelled")


@pytest.fixture(scope="module")
def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_a_background_response_runs_detached_and_ends_stored(sdk: openai.OpenAI, model_id: str) -> None:
    created = sdk.responses.create(model=model_id, input="Count from 1 to 5.", background=True,
                                   max_output_tokens=16, temperature=0)
    assert created.status in ("queued", "in_progress") and created.background is True
    wait_for(lambda: sdk.responses.retrieve(created.id).status in ENDED, what="the background response's end")
    done = sdk.responses.retrieve(created.id)
    assert done.status in ("completed", "incomplete"), done
    assert done.output_text and done.usage is not None and done.usage.output_tokens > 0
    # Cancelling one that has ended answers it as it ended (OpenAI: idempotent).
    assert sdk.responses.cancel(created.id).status == done.status


def test_cancel_stops_a_running_background_response(sdk: openai.OpenAI, model_id: str) -> None:
    created = sdk.responses.create(model=model_id, input="Write a very long story about a lighthouse keeper.",
                                   background=True, max_output_tokens=2000, temperature=0)
    wait_for(lambda: bool(sdk.responses.retrieve(created.id).status == "in_progress"),
             what="the background response to start")
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    again = sdk.responses.retrieve(created.id)
    assert again.status == "cancelled" and again.output == cancelled.output  # it wrote no more
    assert sdk.responses.cancel(created.id).status == "cancelled"


def test_only_a_background_response_can_be_cancelled(sdk: openai.OpenAI, model_id: str) -> None:
    plain = sdk.responses.create(model=model_id, input="Say hi.", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.cancel(plain.id)
    assert caught.value.body["message"] == "Cannot cancel a synchronous response."  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.cancel("resp_unknown")
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=model_id, input="Say hi.", background=True, store=False)
    assert refused.value.body["param"] == "store"  # type: ignore[index]
