"""Stored Responses on the real server: previous_response_id chaining, retrieve, delete and input_items with the
official openai client, a two-turn openai-agents run chained by previous_response_id, the bounds and the API keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import agents
import openai
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import metric, scrape

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}


def texts(items: list[object]) -> list[str]:
    """The text of each message item among OpenAI input items (SDK objects)."""
    found = []
    for item in items:
        if getattr(item, "type", None) == "message":
            found.append("".join(getattr(part, "text", "") for part in item.content))  # type: ignore[attr-defined]
    return found


def test_a_turn_continues_a_stored_response(client: openai.OpenAI, model_id: str) -> None:
    first = client.responses.create(model=model_id, instructions="Answer in one short sentence.",
                                    input="My name is Ada. Say hello to me.", max_output_tokens=16, temperature=0)
    assert first.store is True and first.previous_response_id is None
    second = client.responses.create(model=model_id, previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=16, temperature=0)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    # The earlier turn's input and answer were in this prompt.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    items = list(client.responses.input_items.list(second.id, order="asc"))
    assert texts(items) == ["My name is Ada. Say hello to me.", first.output_text, "What is my name?"]
    assert items[1].id == first.output[0].id and items[1].role == "assistant"
    assert [item.id for item in client.responses.input_items.list(second.id)] == [item.id for item in items][::-1]
    again = client.responses.retrieve(second.id)
    assert again.status == second.status and again.output_text == second.output_text
    assert again.usage.output_tokens == second.usage.output_tokens


def test_input_items_page_as_the_sdk_reads_them(client: openai.OpenAI, model_id: str) -> None:
    first = client.responses.create(model=model_id, input=[{"role": "user", "content": "One."},
                                                           {"role": "assistant", "content": "Two."},
                                                           {"role": "user", "content": "Three?"}],
                                    max_output_tokens=2, temperature=0)
    page = client.responses.input_items.list(first.id, limit=2, order="asc")
    assert texts(page.data) == ["One.", "Two."] and page.has_more
    assert texts(list(page)) == ["One.", "Two.", "Three?"]  # the SDK fetched the next page `after` the last id
    assert texts(list(client.responses.input_items.list(first.id, limit=1, order="asc").iter_pages())[2].data) \
        == ["Three?"]


def test_a_chained_tool_result_needs_only_the_output(client: openai.OpenAI, model_id: str) -> None:
    first = client.responses.create(model=model_id, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=60, temperature=0)
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model=model_id, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=24, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}])
    assert second.output[0].type == "message" and second.output_text.strip()
    kinds = [item.type for item in client.responses.input_items.list(second.id, order="asc")]
    assert kinds == ["message", "function_call", "function_call_output"]


def test_store_false_keeps_nothing_and_unknown_ids_are_404s(client: openai.OpenAI, model_id: str) -> None:
    kept_not = client.responses.create(model=model_id, input="Hi", max_output_tokens=2, store=False)
    assert kept_not.store is False
    for call in (lambda: client.responses.retrieve(kept_not.id), lambda: client.responses.delete(kept_not.id),
                 lambda: client.responses.input_items.list(kept_not.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body["message"] == f"Response with id '{kept_not.id}' not found."
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=model_id, input="Hi", previous_response_id=kept_not.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    assert caught.value.body["param"] == "previous_response_id"


def test_a_deleted_response_is_gone(client: openai.OpenAI, model_id: str) -> None:
    first = client.responses.create(model=model_id, input="Hi", max_output_tokens=2)
    second = client.responses.create(model=model_id, input="Again", previous_response_id=first.id,
                                     max_output_tokens=2)
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert client.responses.retrieve(second.id).previous_response_id == first.id  # its own copy of the turns


def test_a_streaming_response_is_retrievable_in_progress_then_complete(client: openai.OpenAI, model_id: str
                                                                       ) -> None:
    with client.responses.create(model=model_id, input="Count from 1 to 20.", max_output_tokens=40,
                                 temperature=0, stream=True) as stream:
        events = iter(stream)
        created = next(events)
        assert created.type == "response.created"
        during = client.responses.retrieve(created.response.id)
        assert during.status == "in_progress" and during.store is True
        final = [event for event in events][-1]
    assert final.type in ("response.completed", "response.incomplete")
    after = client.responses.retrieve(created.response.id)
    assert after.status == final.response.status and after.output_text == final.response.output_text


def test_openai_agents_chain_two_turns_by_previous_response_id(client: openai.OpenAI, server: RunningServer,
                                                               model_id: str) -> None:
    agents.set_tracing_disabled(True)  # traces would go to OpenAI's servers
    async_client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    agent = agents.Agent(name="Helper", instructions="Answer in one short sentence.",
                         model=agents.OpenAIResponsesModel(model=model_id, openai_client=async_client),
                         model_settings=agents.ModelSettings(max_tokens=24, temperature=0))
    first = agents.Runner.run_sync(agent, "My name is Ada.")
    second = agents.Runner.run_sync(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert isinstance(second.final_output, str) and second.final_output.strip()
    assert first.last_response_id and second.last_response_id
    kept = client.responses.retrieve(second.last_response_id)
    assert kept.previous_response_id == first.last_response_id
    items = texts(list(client.responses.input_items.list(second.last_response_id, order="asc")))
    assert items == ["My name is Ada.", first.final_output, "What is my name?"]


# ---- the bounds and the keys: a server of its own ----------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(Path(tmp_path_factory.mktemp("stored")), "--api-key", "sk-one", "--api-key", "sk-two",
                    "--parallel", "1", "--ctx-size", "2048", "--responses-store-entries", "2") as running:
        yield running


def sdk(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_one_key_cannot_see_anothers_responses(keyed_server: RunningServer, model_id: str) -> None:
    one, two = sdk(keyed_server, "sk-one"), sdk(keyed_server, "sk-two")
    mine = one.responses.create(model=model_id, input="Hi", max_output_tokens=2)
    for call in (lambda: two.responses.retrieve(mine.id), lambda: two.responses.input_items.list(mine.id),
                 lambda: two.responses.create(model=model_id, input="Hi", previous_response_id=mine.id,
                                              max_output_tokens=2),
                 lambda: two.responses.delete(mine.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert one.responses.retrieve(mine.id).id == mine.id


def test_the_least_recently_used_response_is_dropped_and_counted(keyed_server: RunningServer, model_id: str
                                                                 ) -> None:
    one = sdk(keyed_server, "sk-one")
    made = [one.responses.create(model=model_id, input=f"Say {word}.", max_output_tokens=2).id
            for word in ("one", "two", "three")]
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(made[0])
    assert [one.responses.retrieve(response_id).id for response_id in made[1:]] == made[1:]
    samples = scrape(keyed_server, {"authorization": "Bearer sk-one"})
    assert metric(samples, "edge_llm_stored_responses") == 2
    assert metric(samples, "edge_llm_stored_responses_evictions_total", bound="entries") >= 1
    assert metric(samples, "edge_llm_stored_responses_bytes") > 0
    assert json.loads(one.responses.retrieve(made[2]).model_dump_json())["store"] is True
