"""Anthropic's Messages API, the pure parts: blocks → chat messages, stop_reason, the event sequence and the error
envelope; answers checked against the official anthropic package's types, so its client parses what we send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from edge_llm.api.params import take_unknown
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter, ValidationError

from edge_llm.api.errors import APIError, speaks_anthropic
from edge_llm.api.request_context import CONTEXT_KEY, RequestContext
from edge_llm.api.telemetry import RequestRecord
from edge_llm.api.protocol.anthropic import CountTokensRequest, MessagesRequest, set_aside_server_tools
from edge_llm.api.protocol.anthropic_answers import stop_reason, tool_input, usage
from edge_llm.api.serving.messages import _Blocks, tool_use_block
from edge_llm.engine.thread.text import OutputText
from edge_llm.engine.types import Finished, FinishReason, Usage
from edge_llm.prompting.chat_template import ChatTemplate
from edge_llm.prompting.prompt import PromptBuilder
from edge_llm.prompting.tools import ParsedToolCall
from tests.unit.test_chat_template import SPECIALS, FakeTokenizer, plain
from tests.unit.test_ops_security import refusal
from tests.helpers import parse_sse

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
EVENTS = TypeAdapter(RawMessageStreamEvent)


def body(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8,
                                           "messages": [{"role": "user", "content": "hi"}], **fields})


def finished(reason: FinishReason, stop: str | None = None) -> Finished:
    return Finished(reason, Usage(10, 3, 4), {}, stop)


# ---- blocks → chat messages ---------------------------------------------------------------------


def test_system_blocks_and_a_tool_round_trip_become_chat_messages() -> None:
    request = body(system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                           {"type": "text", "text": "Use tools."}],
                   tools=[WEATHER],
                   messages=[
                       {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                                    {"type": "text", "text": "Paris?"}]},
                       {"role": "assistant", "content": [
                           {"type": "text", "text": "Let me look."},
                           {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                       {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "22 C"}]},
                           {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": True},
                           {"type": "text", "text": "And Rome?"}]},
                   ])
    assert request.to_chat_messages() == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "22 C", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: down", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "And Rome?"},
    ]
    assert request.openai_tools() == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"], "description": "Weather in a city"}}]


def test_a_final_assistant_message_is_a_prefill_the_answer_continues() -> None:
    prefill = body(messages=[{"role": "user", "content": "JSON please"},
                             {"role": "assistant", "content": [{"type": "text", "text": "{\"a\":"}]}])
    assert prefill.continues_final and prefill.to_chat_messages()[-1] == {"role": "assistant", "content": "{\"a\":"}
    assert not body().continues_final
    builder = PromptBuilder(ChatTemplate(None), FakeTokenizer(), bos_token=None, control_tokens=SPECIALS)
    tokens = builder.build(prefill.to_chat_messages(), continue_final=True)
    # ChatML: the assistant turn is left open after its text; no end of turn, no new turn
    assert tokens[-len(plain("assistant\n{\"a\":")) - 1:] == [1, *plain("assistant\n{\"a\":")]
    assert tokens.count(2) == 1


def test_tool_choice_decides_the_tools_shown_and_the_forced_functions() -> None:
    assert body(tools=[WEATHER]).forced_functions() is None
    assert body(tools=[WEATHER], tool_choice={"type": "auto"}).forced_functions() is None
    assert [f["name"] for f in body(tools=[WEATHER], tool_choice={"type": "any"}).forced_functions()] == ["get_weather"]
    named = body(tools=[WEATHER, {**WEATHER, "name": "other"}], tool_choice={"type": "tool", "name": "other"})
    assert [f["name"] for f in named.forced_functions()] == ["other"]
    none = body(tools=[WEATHER], tool_choice={"type": "none"})
    assert none.openai_tools() is None and none.forced_functions() is None


def test_output_config_format_is_a_schema_and_excludes_a_forced_call() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    assert body(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}
                ).output_schema == schema
    assert body().output_schema is None
    with pytest.raises(ValidationError):
        body(output_config={"format": {"type": "json_schema", "schema": schema}}, tools=[WEATHER],
             tool_choice={"type": "any"})


@pytest.mark.parametrize("fields", [
    {"max_tokens": 0},
    {"temperature": 1.5},
    {"messages": []},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "ends in a space "}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]},
    {"tool_choice": {"type": "any"}},
    {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "missing"}},
    {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
    {"stop_sequences": [""]},
])
def test_bodies_anthropic_refuses_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        body(**fields)


def test_what_claude_code_sends_back_is_read() -> None:
    # A system turn inside `messages` (Claude Code: "messages.1.role" was a 400), thinking blocks of an earlier
    # answer (Anthropic requires them sent back), server tools beside client tools.
    raw = {"model": "m", "max_tokens": 8, "tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}],
           "messages": [
               {"role": "user", "content": "Weather?"},
               {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                                 {"type": "redacted_thinking", "data": "x"},
                                                 {"type": "text", "text": "Looking."}]},
               {"role": "user", "content": "Thanks"}]}
    assert set_aside_server_tools(raw) == ["tools.1"]
    request = body(**raw)
    assert [tool.name for tool in request.active_tools] == ["get_weather"]
    assert request.to_chat_messages() == [{"role": "user", "content": "Weather?"},
                                          {"role": "system", "content": "Use tools."},
                                          {"role": "assistant", "content": "Looking."},
                                          {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("kind", ["image", "document"])
def test_images_and_documents_are_refused_saying_the_model_reads_text_only(kind: str) -> None:
    with pytest.raises(ValidationError, match=f"{kind} blocks cannot be read: this model reads text only"):
        body(messages=[{"role": "user", "content": [{"type": kind, "source": {"type": "base64", "data": "x"}}]}])


def test_count_tokens_takes_the_prompt_fields_only() -> None:
    request = CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 3})
    assert take_unknown(request) == ["max_tokens"]  # not a prompt field: ignored and reported


# ---- the answer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("done", "calls", "expected"), [
    (finished(FinishReason.STOP), False, "end_turn"),
    (finished(FinishReason.STOP, "7"), False, "stop_sequence"),
    (finished(FinishReason.LENGTH), False, "max_tokens"),
    (finished(FinishReason.TIMEOUT), False, "end_turn"),
    (finished(FinishReason.STOP), True, "tool_use"),
])
def test_stop_reason(done: Finished, calls: bool, expected: str) -> None:
    assert stop_reason(done, calls) == expected


def test_the_engine_names_the_stop_string_that_ended_the_text() -> None:
    output = OutputText(["END", "7"])
    assert output.feed(b"1, 2, 7, END") == "1, 2, " and output.stop_string == "7"
    assert OutputText(["x"]).stop_string is None


def test_usage_counts_cached_input_apart_and_a_message_parses_with_the_sdk() -> None:
    assert usage(30, 5, 12) == {"input_tokens": 18, "output_tokens": 5, "cache_read_input_tokens": 12,
                                "cache_creation_input_tokens": 0}
    call = ParsedToolCall("call_abc", "get_weather", '{"city": "Paris"}')
    message = Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "tool_use",
        "stop_sequence": None, "usage": usage(30, 5, 12),
        "content": [{"type": "text", "text": "Sure."}, tool_use_block(call)]})
    assert message.content[1].input == {"city": "Paris"} and message.content[1].id == "toolu_abc"
    assert tool_input('"just text"') == {"arguments": "just text"} and tool_input("{oops") == {"arguments": "{oops"}


def test_streamed_blocks_are_anthropic_events_with_consecutive_indexes() -> None:
    blocks = _Blocks()
    call = ParsedToolCall("call_abc", "get_weather", '{"city": "Paris"}')
    raw = b"".join([*blocks.add("Let me ", []), *blocks.add("look.", [call]), *blocks.add("Done.", []),
                    *blocks.close(final=True)])
    events = [EVENTS.validate_python(json.loads(data)) for _, data in parse_sse(raw.decode())]
    assert [(e.type, getattr(e, "index", None)) for e in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_stop", 2),
    ]
    assert json.loads(events[5].delta.partial_json) == {"city": "Paris"}
    assert [name for name, _ in parse_sse(raw.decode())][:2] == ["content_block_start", "content_block_delta"]


def test_an_answer_without_blocks_still_gets_an_empty_text_block() -> None:
    blocks = _Blocks()
    raw = b"".join(blocks.close(final=True)).decode()
    assert [json.loads(data)["type"] for _, data in parse_sse(raw)] == ["content_block_start",
                                                                           "content_block_stop"]


# ---- errors and keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
    (413, "request_too_large"), (503, "overloaded_error"), (500, "api_error"), (431, "invalid_request_error"),
])
def test_errors_on_the_messages_routes_wear_anthropics_envelope(status: int, kind: str) -> None:
    error = APIError(status, "nope", code="some_code")
    answer = json.loads(error.response("/v1/messages").body)
    assert answer == {"type": "error", "error": {"type": kind, "message": "nope",
                                                 "details": {"error_code": "some_code"}}}
    assert json.loads(error.response("/v1/messages/count_tokens").body)["type"] == "error"
    assert json.loads(error.response("/v1/chat/completions").body)["error"]["code"] == "some_code"
    assert not speaks_anthropic("/v1/messagesx") and not speaks_anthropic(None)
    # the access line and the rejection metrics get the code as data, from either envelope (not out of its JSON)
    for path in ("/v1/messages", "/x", "/api/chat"):
        assert sent_error_code(error, path) == "some_code"


def sent_error_code(error: APIError, path: str) -> str | None:
    """The error code noted in the request's context when `error`'s response is sent on `path`."""
    context = RequestContext(RequestRecord("req", "POST", path, 0.0))
    scope = {"type": "http", "method": "POST", "path": path, "headers": [], CONTEXT_KEY: context}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(error.response(path)(scope, receive, send))
    assert sent[0]["status"] == error.status
    return context.record.error_code


def test_x_api_key_is_a_key_and_every_credential_given_must_be_one() -> None:
    keys = ["k1"]
    assert refusal(keys, None, "k1") is None and refusal(keys, "Bearer k1", "k1") is None
    assert refusal(keys, None, "k2") == "wrong key"
    assert refusal(keys, "Bearer k1", "k2") == "wrong key" and refusal(keys, "Bearer k2", "k1") == "wrong key"
    assert refusal(keys, None, " ") == "empty x-api-key header"
    assert refusal(keys, None, None) == "missing key"
