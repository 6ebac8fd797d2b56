"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) with the official `anthropic` client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import jsonschema
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import RecordingTransport, long_prompt, parse_sse
from tests.server_pool import SMALL_CHUNK

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
SAY_HELLO = [{"role": "user", "content": "Say hello in three words."}]


def sdk(server: RunningServer, api_key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server: RunningServer) -> anthropic.Anthropic:
    return sdk(server)


@pytest.fixture(scope="module")
def repeatable_claude(repeatable_server: RunningServer) -> anthropic.Anthropic:
    return sdk(repeatable_server)


def texts(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_a_plain_answer(claude: anthropic.Anthropic, model_id: str) -> None:
    message = claude.messages.create(model=model_id, max_tokens=16, system="You are terse.", messages=SAY_HELLO,
                                     metadata={"user_id": "someone"}, extra_body={"temperature": 0})
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == model_id
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert 1 <= message.usage.output_tokens <= 16 and message.usage.input_tokens >= 1


def test_a_stop_sequence_ends_the_answer_and_is_named(claude: anthropic.Anthropic, model_id: str) -> None:
    message = claude.messages.create(
        model=model_id, max_tokens=48, extra_body={"temperature": 0}, stop_sequences=["7"],
        messages=[{"role": "user", "content": "Count from 1 to 12, separated by commas and spaces. Only numbers."}])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "7"
    assert "7" not in texts(message) and "6" in texts(message)


def test_a_final_assistant_message_is_continued(claude: anthropic.Anthropic, model_id: str) -> None:
    message = claude.messages.create(
        model=model_id, max_tokens=3, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."},
                  {"role": "assistant", "content": "1, 2, 3, 4,"}])
    assert texts(message).lstrip().startswith("5")  # the prefill goes on; it is not repeated


def test_streaming_events_and_text_equal_the_whole_answer(repeatable_claude: anthropic.Anthropic,
                                                          model_id: str) -> None:
    # This SDK has no sampling arguments any more (newer Claude models take none); the server still reads them.
    request: dict[str, Any] = {"model": model_id, "max_tokens": 10, "messages": SAY_HELLO,
                               "extra_body": {"temperature": 0}}
    whole = repeatable_claude.messages.create(**request)
    with repeatable_claude.messages.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and "content_block_start" in kinds and "content_block_stop" in kinds
    deltas = [event.delta.text for event in events if event.type == "content_block_delta"]
    assert "".join(deltas) == texts(final) == texts(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_long_prompt_sends_pings_while_it_is_prefilled(small_chunks_server: RunningServer, model_id: str) -> None:
    wire = RecordingTransport()
    claude = anthropic.Anthropic(base_url=small_chunks_server.url, api_key="unused", max_retries=0,
                                 http_client=httpx2.Client(transport=wire, timeout=300))
    with claude.messages.stream(model=model_id, max_tokens=2, extra_body={"temperature": 0}, messages=[
            {"role": "user", "content": long_prompt("Inventory") + "\nWhich slot holds 420?"}]) as stream:
        final = stream.get_final_message()  # the SDK skips pings: they cost its reader nothing
    assert final.usage.input_tokens > 4 * SMALL_CHUNK and final.stop_reason in ("max_tokens", "end_turn")
    kinds = [name for name, _ in parse_sse(bytes(wire.received))]
    answer_starts = kinds.index("content_block_start")
    assert kinds[0] == "message_start" and set(kinds[1:answer_starts]) == {"ping"}
    # The opening ping and at least one more while the prompt's chunks are computed (at most one a second: how many
    # more depends on the machine's speed; tests/unit/test_prefill_beats.py checks the interval).
    assert answer_starts >= 3, kinds
    assert "ping" not in kinds[answer_starts:]


def test_a_tool_round_trip(claude: anthropic.Anthropic, model_id: str) -> None:
    forced: dict[str, Any] = {"model": model_id, "max_tokens": 64, "tools": [WEATHER],
                              "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": ASK_WEATHER}
    message = claude.messages.create(**forced)
    assert message.stop_reason == "tool_use"
    call = next(block for block in message.content if block.type == "tool_use")
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    # Streamed, the SDK rebuilds the input from input_json_delta events.
    with claude.messages.stream(**forced) as stream:
        streamed = stream.get_final_message()
    streamed_call = next(block for block in streamed.content if block.type == "tool_use")
    jsonschema.validate(streamed_call.input, WEATHER["input_schema"])
    assert streamed.stop_reason == "tool_use"

    answer = claude.messages.create(
        model=model_id, max_tokens=12, tools=[WEATHER], tool_choice={"type": "none"},
        messages=[*ASK_WEATHER, {"role": "assistant", "content": message.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "22 degrees Celsius and sunny"}]}])
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"] and texts(answer).strip()


def test_count_tokens_is_the_prompt_of_an_answer(repeatable_claude: anthropic.Anthropic, model_id: str) -> None:
    request: dict[str, Any] = {"model": model_id, "system": "You are terse.", "messages": SAY_HELLO,
                               "tools": [WEATHER]}
    counted = repeatable_claude.messages.count_tokens(**request)
    message = repeatable_claude.messages.create(max_tokens=1, **request)
    # No prefix cache on this server: the whole prompt is input_tokens (elsewhere cached tokens are counted apart).
    assert message.usage.cache_read_input_tokens == 0
    assert counted.input_tokens == message.usage.input_tokens > 0
    assert message.usage.output_tokens == 1


def test_missing_max_tokens_is_a_400_in_anthropics_envelope(claude: anthropic.Anthropic, model_id: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as raised:
        claude.post("/v1/messages", cast_to=object, body={"model": model_id, "messages": SAY_HELLO})
    assert raised.value.status_code == 400
    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in raised.value.body["error"]["message"]


def test_an_unknown_model_is_a_404_not_found_error(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as raised:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=SAY_HELLO)
    assert raised.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="no-such-model", messages=SAY_HELLO)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(Path(tmp_path_factory.mktemp("keyed")), "--api-key", "sk-test", "--parallel", "1") as running:
        yield running


def test_x_api_key_is_a_key_and_refusals_wear_anthropics_envelope(keyed_server: RunningServer,
                                                                    model_id: str) -> None:
    assert sdk(keyed_server, "sk-test").messages.count_tokens(model=model_id, messages=SAY_HELLO).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as raised:
        sdk(keyed_server, "sk-wrong").messages.count_tokens(model=model_id, messages=SAY_HELLO)
    assert raised.value.body["error"]["type"] == "authentication_error"
    # The other routes take it too, and keep OpenAI's envelope.
    assert httpx.get(keyed_server.url + "/v1/models", headers={"x-api-key": "sk-test"}).status_code == 200
    refused = httpx.get(keyed_server.url + "/v1/models", headers={"x-api-key": "sk-wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


# ---- what Claude Code and the SDK send (issue 37) -------------------------------------------------------------------


def test_the_sdk_lists_and_retrieves_models_in_anthropics_shape(claude: anthropic.Anthropic, model_id: str) -> None:
    listed = claude.models.list()  # the SDK validates Anthropic's shape: type, id, display_name, created_at
    assert [model.id for model in listed.data] == [model_id]
    assert listed.data[0].type == "model" and listed.data[0].display_name == model_id
    assert claude.models.retrieve(model_id).id == model_id


def test_a_system_turn_thinking_blocks_and_server_tools_are_read_as_claude_code_sends_them(server: RunningServer,
                                                                                        model_id: str) -> None:
    # Claude Code puts a system turn in `messages` (it was "messages.1.role" 400), sends back thinking blocks and
    # declares server tools beside its own.
    body = {"model": model_id, "max_tokens": 8, "temperature": 0,
            "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
            "messages": [{"role": "user", "content": "Hello"},
                         {"role": "system", "content": "Answer in one word."},
                         {"role": "assistant", "content": [{"type": "thinking", "thinking": "…", "signature": "s"},
                                                           {"type": "text", "text": "Hi."}]},
                         {"role": "user", "content": "Say yes."}]}
    response = httpx.post(server.url + "/v1/messages?beta=true", json=body, timeout=120,
                          headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    assert response.json()["content"], response.json()
    assert response.headers["x-edge-llm-ignored-fields"] == "tools.1"


def test_an_image_block_is_a_clear_400_in_anthropics_envelope(claude: anthropic.Anthropic, model_id: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=model_id, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "What is this?"}]}])
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert "image blocks cannot be read: this model reads text only" in error["message"], error
