"""POST /v1/responses on the real model with the official openai client (and the openai-agents SDK)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import agents
import openai

from edge_llm.testing.server import RunningServer
from tests.helpers import long_prompt, parse_sse
from tests.server_pool import SMALL_CHUNK

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}


def test_plain_answer_with_usage(client: openai.OpenAI, model_id: str) -> None:
    response = client.responses.create(model=model_id, instructions="Answer in one short sentence.",
                                       input="What is the capital of France?", max_output_tokens=24, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.error is None
    assert response.output_text.strip()
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_an_answer_cut_short_is_incomplete(client: openai.OpenAI, model_id: str) -> None:
    response = client.responses.create(model=model_id, input="Count from 1 to 50, separated by commas.",
                                       max_output_tokens=4, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4


def test_streamed_events_come_in_order_and_the_deltas_make_the_answer(client: openai.OpenAI, model_id: str
                                                                      ) -> None:
    with client.responses.create(model=model_id, input="Say hello in three words.", max_output_tokens=16,
                                 temperature=0, stream=True) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          events[-1].type]
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas and deltas == events[-1].response.output_text == events[-4].text
    assert events[-1].response.usage.output_tokens > 0


def test_a_long_prompt_repeats_in_progress_while_it_is_prefilled(small_chunks_server: RunningServer,
                                                                  model_id: str) -> None:
    # Codex drops a stream after 300 s without an event (SSE comments do not count): a long prefill must show.
    client = openai.OpenAI(base_url=small_chunks_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    with client.responses.stream(model=model_id, input=long_prompt("Ledger") + "\nWhich slot holds 420?",
                                 max_output_tokens=2, temperature=0) as stream:
        events = list(stream)  # the SDK's stream helper checks each snapshot's identity as it accumulates
    final = events[-1].response  # incomplete (max_output_tokens): get_final_response wants a completed one
    kinds = [event.type for event in events]
    answer_starts = next(i for i, kind in enumerate(kinds) if kind not in ("response.created", "response.in_progress"))
    assert kinds[0] == "response.created" and set(kinds[1:answer_starts]) == {"response.in_progress"}
    # The opening in_progress and at least one more while the prompt's chunks are computed (at most one a second:
    # how many more depends on the machine's speed; tests/unit/test_prefill_beats.py checks the interval).
    assert answer_starts >= 3, kinds
    assert "response.in_progress" not in kinds[answer_starts:]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    snapshots = [event.response for event in events[:answer_starts]]
    assert {(snapshot.id, snapshot.status, len(snapshot.output)) for snapshot in snapshots[1:]} == {
        (final.id, "in_progress", 0)}
    assert final.usage is not None and final.usage.input_tokens > 4 * SMALL_CHUNK


def test_llama_servers_telemetry_progress_and_timings_per_token(small_chunks_server: RunningServer,
                                                                 model_id: str) -> None:
    """llama-server's `return_progress` / `timings_per_token` in a Responses stream (llama.cpp's
    test_compat_oai_responses): each prefill chunk's progress on a response.in_progress, its timings on each delta,
    the answer's on the end; without them, only the end's timings."""
    body = {"model": model_id, "input": long_prompt("Telemetry", entries=12), "max_output_tokens": 3,
            "temperature": 0, "stream": True, "store": False, "timings_per_token": True, "return_progress": True}
    response = httpx.post(small_chunks_server.url + "/responses", json=body, timeout=300)
    assert response.status_code == 200 and "x-edge-llm-ignored-fields" not in response.headers
    events = [json.loads(data) for _, data in parse_sse(response.content)]
    end = events[-1]
    usage = end["response"]["usage"]
    progress = [event["prompt_progress"] for event in events if "prompt_progress" in event]
    assert {event["type"] for event in events if "prompt_progress" in event} == {"response.in_progress"}
    # One per chunk the engine reports (not one a second): the prompt is over three chunks of 64.
    assert usage["input_tokens"] > 3 * SMALL_CHUNK and len(progress) >= 2, progress
    assert all(step["total"] == usage["input_tokens"] and step["cache"] <= step["processed"] < step["total"]
               for step in progress)
    assert [step["processed"] for step in progress] == sorted({step["processed"] for step in progress})
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert deltas and all("timings" in event for event in deltas)
    assert [event["timings"]["predicted_n"] for event in deltas] == sorted(
        {event["timings"]["predicted_n"] for event in deltas})
    assert deltas[0]["timings"]["predicted_per_second"] == 0.0  # as llama-server: counted from the first token
    final = end["timings"]
    assert end["type"] in ("response.completed", "response.incomplete")
    assert (final["predicted_n"], final["prompt_n"] + final["cache_n"]) == (usage["output_tokens"],
                                                                           usage["input_tokens"])
    assert final["prompt_ms"] > 0 and final["prompt_per_second"] > 0

    plain = httpx.post(small_chunks_server.url + "/responses", timeout=120, json={
        "model": model_id, "input": "Hi", "max_output_tokens": 2, "stream": True, "store": False})
    events = [json.loads(data) for _, data in parse_sse(plain.content)]
    assert [event["type"] for event in events if "timings" in event or "prompt_progress" in event] == [
        events[-1]["type"]]


def test_json_schema_text_format_is_enforced(client: openai.OpenAI, model_id: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    response = client.responses.create(
        model=model_id, input="Invent a person. Reply in JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema"


def test_tool_round_trip(client: openai.OpenAI, model_id: str) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(model=model_id, input=[question], tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # Stateless: the client sends the conversation back with the call and its output.
    second = client.responses.create(
        model=model_id, tools=[WEATHER], max_output_tokens=24, temperature=0,
        input=[question, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}])
    assert second.output[0].type == "message" and second.output_text.strip()


def test_auto_tool_choice_streams_the_model_s_call(client: openai.OpenAI, model_id: str) -> None:
    """The default model answers with a bare {"name", "arguments"} object: a function_call item all the same."""
    with client.responses.create(model=model_id, input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="auto", max_output_tokens=60, temperature=0, stream=True) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = next(event for event in events if event.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments)["city"]
    assert events[-1].response.output[-1].type == "function_call"


def test_openai_agents_sdk_runs_an_agent_against_the_server(server: RunningServer, model_id: str) -> None:
    agents.set_tracing_disabled(True)  # traces would go to OpenAI's servers
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    agent = agents.Agent(name="Helper", instructions="Answer in one short sentence.",
                         model=agents.OpenAIResponsesModel(model=model_id, openai_client=client),
                         model_settings=agents.ModelSettings(max_tokens=24, temperature=0))
    result = agents.Runner.run_sync(agent, "What is 2 + 2?")
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_without_v1_and_a_json_schema_without_schema_is_a_400(server: RunningServer) -> None:
    """As llama.cpp's test_compat_oai_responses calls it: POST /responses."""
    body = {"input": "Write an example", "max_output_tokens": 4, "text": {"format": {"type": "json_schema",
                                                                                    "name": "test"}}}
    refused = httpx.post(server.url + "/responses", json=body, timeout=60)
    assert refused.status_code == 400 and "needs a schema" in refused.json()["error"]["message"]
    body["text"] = {"format": {"type": "text"}}
    assert httpx.post(server.url + "/responses", json=body, timeout=120).json()["output"][0]["type"] == "message"


def test_codexs_other_tools_and_items_are_set_aside_and_named(server: RunningServer, model_id: str) -> None:
    # Codex CLI declares `namespace` and `web_search` tools (it was a 400 "Tools of type ... are not supported") and
    # sends back reasoning and web_search_call items of earlier turns.
    body = {"model": model_id, "max_output_tokens": 8, "temperature": 0, "store": False,
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}},
                      {"type": "namespace", "name": "mcp__files", "tools": []}, {"type": "web_search"}],
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                      {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
                      {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say yes."}]}]}
    response = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert response.json()["status"] in ("completed", "incomplete")
    assert set(response.headers["x-edge-llm-ignored-fields"].split(",")) == {"tools.1", "tools.2", "input.2"}
    assert [tool["name"] for tool in response.json()["tools"]] == ["shell"]
