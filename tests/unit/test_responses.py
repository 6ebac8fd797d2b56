"""The Responses API's pure parts: input items → chat messages, output items, the event sequence; checked against
the official openai package's types so its client parses what the server sends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from edge_llm.api.errors import APIError
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest
from edge_llm.api.protocol.responses import ResponsesRequest, set_aside_unread
from edge_llm.api.serving.responses import answer_events, encode, refuse_unsupported
from edge_llm.api.serving.responses_events import ResponseBuilder
from edge_llm.engine.types import Usage
from edge_llm.api.serving.tool_calls import ToolCallTail
from edge_llm.prompting.tools import ParsedToolCall
from tests.helpers import parse_sse

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
USAGE = Usage(prompt_tokens=20, completion_tokens=5, cached_tokens=4)
EVENTS = TypeAdapter(ResponseStreamEvent)


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", **fields})


def builder(**fields: Any) -> ResponseBuilder:
    return ResponseBuilder("m", request(input="hi", **fields).echo(stored=True))


# ---- input → chat -------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = ChatCompletionRequest.model_validate(request(input="Hello", instructions="Be brief.").to_chat())
    assert chat.to_messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]


def test_items_become_chat_messages_with_tool_calls_and_tool_results() -> None:
    body = request(input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                         {"type": "input_text", "text": "Paris?"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city": "Lyon"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "20 C"}]},
    ], tools=[WEATHER])
    messages = ChatCompletionRequest.model_validate(body.to_chat()).to_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Weather in Paris?"
    assert messages[2]["content"] == "Checking."
    assert [c["function"]["arguments"] for c in messages[2]["tool_calls"]] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert [(m["tool_call_id"], m["content"]) for m in messages[3:]] == [("call_a", "18 C"), ("call_b", "20 C")]


def test_tools_tool_choice_and_text_format_map_to_the_chat_request() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = request(input="x", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
                   text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
                   max_output_tokens=7, temperature=0.2, top_p=0.5)
    chat = ChatCompletionRequest.model_validate(body.to_chat())
    assert chat.tools[0].function.name == "get_weather"
    assert chat.tool_choice.function.name == "get_weather"
    assert chat.response_format.json_schema.schema_ == schema
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (7, 0.2, 0.5)


@pytest.mark.parametrize("item, words", [
    ({"type": "web_search_call", "id": "x"}, "'web_search_call'"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}, "'input_image'"),
    ({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}, "'input_file'"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "call_id"),
])
def test_other_item_and_part_types_are_refused_by_name(item: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        request(input=[item])


def test_a_json_schema_format_needs_a_schema() -> None:
    with pytest.raises(ValidationError, match="needs a schema"):
        request(input="x", text={"format": {"type": "json_schema", "name": "test"}})


@pytest.mark.parametrize("fields, param", [
    ({"conversation": "conv_1"}, "conversation"),
    ({"background": True, "stream": True}, "stream"),
    ({"background": True, "store": False}, "store"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_what_this_server_cannot_do_is_a_400_that_says_why(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as caught:
        refuse_unsupported(request(input="x", **fields))
    assert (caught.value.status, caught.value.param) == (400, param)
    if param == "conversation":
        assert "previous_response_id" in caught.value.message


def test_a_continued_request_reads_the_stored_items_first() -> None:
    stored = [{"id": "msg_1", "type": "message", "role": "user", "status": "completed",
               "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
              {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
               "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    body = request(input=[{"type": "function_call_output", "call_id": "call_1", "output": "18 C"}],
                   previous_response_id="resp_1", instructions="Be brief.").continued(stored)
    messages = ChatCompletionRequest.model_validate(body.to_chat()).messages
    assert [message.role for message in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2].tool_calls[0].function.name == "get_weather" and messages[3].tool_call_id == "call_1"
    assert body.echo(stored=False)["previous_response_id"] == "resp_1"


def test_other_tools_and_items_are_set_aside_and_named_and_reasoning_is_left_out() -> None:
    # Codex declares `namespace` and `web_search` tools and sends back the reasoning and web_search_call items of
    # an earlier turn (codex-rs/core: client_common.rs tools, ResponseItem).
    raw = {"input": [{"type": "message", "role": "user", "content": "hi"},
                     {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
                     {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
                     {"type": "message", "role": "assistant", "content": "hello"}],
           "tools": [{"type": "namespace", "name": "mcp"}, WEATHER, {"type": "web_search"}]}
    assert set_aside_unread(raw) == ["input.2", "tools.0", "tools.2"]
    body = request(**raw)
    refuse_unsupported(body)
    assert [tool.name for tool in body.tools or []] == [WEATHER["name"]]
    assert [(m.role, m.content) for m in body.chat_messages()] == [("user", "hi"), ("assistant", "hello")]


# ---- the answer ---------------------------------------------------------------------------------


def test_a_text_answer_streams_the_full_event_sequence_and_ends_in_the_same_response() -> None:
    answer = builder()
    events = answer.start() + answer.text("Hello") + answer.text(", world") + answer.finish(USAGE)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    parsed = [EVENTS.validate_python(e) for e in events]  # the openai package's own types
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello, world" == "".join(e.delta for e in parsed if e.type.endswith("text.delta"))
    assert final.status == "completed" and final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens, final.usage.total_tokens) == (20, 5, 25)
    assert final.usage.input_tokens_details.cached_tokens == 4
    assert final.output[0].content[0].annotations == []


def test_a_tool_call_is_a_function_call_item_and_leading_whitespace_makes_no_message() -> None:
    answer = builder(tools=[WEATHER], tool_choice="required")
    tail = ToolCallTail(["get_weather"])
    events = answer.start()
    for piece in ["\n", '<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']:
        events += answer_events(answer, tail, piece)
    events += answer.finish(USAGE)
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    for event in events:
        EVENTS.validate_python(event)
    final = Response.model_validate(events[-1]["response"])
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert final.tools[0].name == "get_weather" and final.tool_choice == "required"


def test_with_auto_a_bare_call_to_a_declared_function_is_a_function_call_item() -> None:
    answer = builder(tools=[WEATHER])
    tail = ToolCallTail(["get_weather"])
    events = [e for piece in ['{"name": "get_weather", ', '"arguments": {"city": "Rome"}}']
              for e in answer_events(answer, tail, piece)]
    assert events == []  # held until the answer ends: it might still turn out to be text
    rest, calls = tail.finish()
    assert rest == "" and [e["type"] for e in answer.tool_call(calls[0])][0] == "response.output_item.added"
    final = Response.model_validate(answer.finish(USAGE)[-1]["response"])
    assert [item.type for item in final.output] == ["function_call"] and final.output_text == ""


def test_text_before_a_tool_call_is_its_own_message_item() -> None:
    answer = builder()
    answer.text("Let me check.")
    answer.tool_call(ParsedToolCall("call_1", "get_weather", '{"city": "Oslo"}'))
    final = Response.model_validate(answer.finish(USAGE)[-1]["response"])
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text == "Let me check."


def test_an_answer_cut_at_max_output_tokens_is_incomplete() -> None:
    answer = builder(max_output_tokens=3)
    answer.text("One two")
    last = answer.finish(USAGE, incomplete_reason="max_output_tokens")[-1]
    assert last["type"] == "response.incomplete"
    final = Response.model_validate(last["response"])
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete" and final.max_output_tokens == 3


def test_a_failure_mid_answer_ends_the_stream_with_response_failed() -> None:
    answer = builder()
    answer.text("Partial")
    events = answer.failed("the engine stopped")
    assert [e["type"] for e in events][-2:] == ["response.output_item.done", "response.failed"]
    failed = EVENTS.validate_python(events[-1])
    assert failed.response.status == "failed" and failed.response.error.message == "the engine stopped"


def test_an_empty_answer_still_has_one_message_item() -> None:
    answer = builder()
    answer.text(" ")
    final = Response.model_validate(answer.finish(USAGE)[-1]["response"])
    assert final.output_text == " " and len(final.output) == 1


def test_each_event_is_an_sse_event_named_by_its_type() -> None:
    event = builder().start()[0]
    ((name, data),) = parse_sse(encode(event).decode())
    assert name == "response.created" == json.loads(data)["type"]
