"""Every wire encoder in api/protocol/ against the official SDK's own types: what it writes must validate as the type
the client parses it into, with no key the SDK does not know (except the extras this server documents), so the wire
cannot drift from the protocol package again."""

from __future__ import annotations

from typing import Any

import ollama
import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import ErrorResponse as AnthropicErrorResponse
from anthropic.types import MessageTokensCount
from anthropic.types import RawMessageStreamEvent
from openai._models import construct_type
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseError, ResponseItemList, ResponseStreamEvent
from openai.types.shared import ErrorObject
from pydantic import BaseModel, TypeAdapter

from edge_llm.api.protocol import anthropic_answers as anthropic
from edge_llm.api.protocol import ollama_answers
from edge_llm.api.errors import APIError
from edge_llm.api.protocol.embeddings import embedding_list
from edge_llm.api.protocol import errors as error_envelopes
from edge_llm.api.protocol.errors import anthropic_error_type, ollama_error, openai_error_type
from edge_llm.api.protocol import responses_answers as responses
from edge_llm.api.serving.outcome import error_body, failure_error
from edge_llm.api.protocol.responses import ResponsesRequest
from edge_llm.api.protocol import openai_answers
from edge_llm.api.protocol.openai_answers import (
    StreamHead,
    chat_choice,
    chat_chunk,
    chat_completion,
    chat_logprobs,
    completion_choice,
    completion_chunk,
    completion_logprobs,
    text_completion,
    usage_chunk,
)
from edge_llm.engine.types import Failed, FinishReason, Finished, TokenLogprob, Usage

HEAD = StreamHead("chatcmpl-1", 1_700_000_000, "qwen")
TIMINGS = {"queue_ms": 1.0, "prefill_ms": 2.0, "decode_ms": 3.0}
OPENAI_USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 3}}
LOGPROBS = {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                         "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}], "refusal": None}


def unknown_keys(value: Any, path: str = "") -> list[str]:
    """The keys a validated SDK object kept as extras (its models allow them): keys the SDK does not know."""
    if isinstance(value, BaseModel):
        found = [f"{path}.{key}" for key in (value.model_extra or {})]
        for name in value.model_fields_set:
            found += unknown_keys(getattr(value, name), f"{path}.{name}")
        return found
    if isinstance(value, list):
        return [key for index, item in enumerate(value) for key in unknown_keys(item, f"{path}.{index}")]
    return []


def validated(kind: Any, payload: dict[str, Any], extras: tuple[str, ...] = ()) -> Any:
    parsed = TypeAdapter(kind).validate_python(payload)
    assert sorted(unknown_keys(parsed)) == sorted(extras), payload
    return parsed


# ---- OpenAI chat and text completions ----------------------------------------------------------


@pytest.mark.parametrize("chunk, extras", [
    (chat_chunk(HEAD, 0, {"role": "assistant", "content": ""}), ()),
    (chat_chunk(HEAD, 1, {"content": "Hi"}, logprobs=LOGPROBS), ()),
    (chat_chunk(HEAD, 0, {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "f", "arguments": "{}"}}]}), ()),
    (chat_chunk(HEAD, 0, {}, "stop", timings=TIMINGS), (".timings",)),
    (usage_chunk(HEAD, "chat.completion.chunk", OPENAI_USAGE), ()),
])
def test_chat_chunks_are_openai_chunks(chunk: dict[str, Any], extras: tuple[str, ...]) -> None:
    parsed = validated(ChatCompletionChunk, dict(chunk), extras)
    assert parsed.id == HEAD.id and parsed.model == HEAD.model and parsed.created == HEAD.created


def test_a_chat_chunk_keeps_explicit_nulls() -> None:
    choice = chat_chunk(HEAD, 0, {"content": "x"})["choices"][0]
    assert choice["finish_reason"] is None and "logprobs" in choice and choice["logprobs"] is None


@pytest.mark.parametrize("chunk, extras", [
    (completion_chunk(HEAD, 0, "Hi"), ()),
    (completion_chunk(HEAD, 0, "Hi", logprobs={"tokens": ["Hi"], "token_logprobs": [-0.5],
                                               "top_logprobs": [{"Hi": -0.5}], "text_offset": [0]}), ()),
    (completion_chunk(HEAD, 0, "", "length", timings=TIMINGS), (".timings",)),
    (usage_chunk(HEAD, "text_completion", OPENAI_USAGE), ()),
])
def test_completion_chunks_are_openai_completions(chunk: dict[str, Any], extras: tuple[str, ...]) -> None:
    # OpenAI streams `"finish_reason": null` until the last chunk (the SDK builds stream chunks without validating,
    # and its Completion type lists only the final reasons): checked as null, validated with a final reason.
    choices = [{**choice, "finish_reason": choice["finish_reason"] or "stop"} for choice in chunk["choices"]]
    assert all(choice["finish_reason"] in (None, "stop", "length") for choice in chunk["choices"])
    validated(Completion, {**chunk, "choices": choices}, extras)


TOKENS = [TokenLogprob(1, b"Hi", -0.5, ((1, b"Hi", -0.5), (2, b"Ho", -1.5))), TokenLogprob(3, b"\xe2\x80", -0.25)]
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}


def test_a_chat_completion_is_the_sdks_chat_completion() -> None:
    choices = [chat_choice(0, "Hi", [], "stop", chat_logprobs(TOKENS)),
               chat_choice(1, None, [CALL], "tool_calls")]
    body = chat_completion("chatcmpl-1", "qwen", choices, OPENAI_USAGE, TIMINGS)
    parsed = validated(ChatCompletion, dict(body), (".timings",))
    assert [choice.finish_reason for choice in parsed.choices] == ["stop", "tool_calls"]
    assert parsed.choices[1].message.tool_calls[0].function.name == "f"
    assert parsed.choices[0].logprobs.content[0].top_logprobs[1].token == "Ho"
    # OpenAI's explicit nulls stay on the wire: content of a tool-call answer, refusal, logprobs not asked for
    assert body["choices"][1]["message"]["content"] is None and body["choices"][1]["logprobs"] is None
    assert "tool_calls" not in body["choices"][0]["message"] and body["choices"][0]["message"]["refusal"] is None


def test_a_text_completion_is_the_sdks_completion() -> None:
    logprobs = completion_logprobs(TOKENS, 5)
    body = text_completion("cmpl-1", "qwen", [completion_choice(0, "EchoHi", "length", logprobs),
                                              completion_choice(1, "Hi", "stop")], OPENAI_USAGE, TIMINGS)
    parsed = validated(Completion, dict(body), (".timings",))
    assert parsed.choices[0].logprobs.text_offset == [5, 7] and parsed.choices[0].logprobs.tokens == ["Hi", "\ufffd"]
    assert parsed.choices[0].logprobs.top_logprobs[0] == {"Hi": -0.5, "Ho": -1.5}
    assert body["choices"][1]["logprobs"] is None and body["system_fingerprint"] is None


def test_the_documented_answer_models_describe_what_the_encoders_send() -> None:
    """The pydantic models the OpenAPI document shows (ChatCompletion, Completion) read each encoder's answer back
    whole: the same keys in the same order, so the documented schema cannot drift from the wire."""
    chat = chat_completion("chatcmpl-1", "qwen", [chat_choice(0, "Hi", [], "stop", chat_logprobs(TOKENS)),
                                                 chat_choice(1, None, [CALL], "tool_calls")], OPENAI_USAGE, TIMINGS)
    text = text_completion("cmpl-1", "qwen", [completion_choice(0, "Hi", "length", completion_logprobs(TOKENS, 0))],
                           OPENAI_USAGE, TIMINGS)
    for documented, body in ((openai_answers.ChatCompletion, chat), (openai_answers.Completion, text)):
        read = documented.model_validate(body).model_dump(mode="json")
        assert list(read) == list(body)
        assert [list(choice) for choice in read["choices"]] == [list(choice) for choice in body["choices"]]


# ---- Anthropic ---------------------------------------------------------------------------------------

USAGE = anthropic.usage(10, 4, 6)
FINISHED = Finished(reason=FinishReason.STOP, usage=Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6),
                    timings={}, stop_sequence="END")


def test_anthropic_events_are_raw_message_stream_events() -> None:
    opening = anthropic.message("msg_1", "qwen", [], None, None, anthropic.usage(10, 0, 0))
    events = [
        anthropic.message_start(opening),
        anthropic.block_start(0, anthropic.text_block("")),
        anthropic.text_delta(0, "Hello"),
        anthropic.block_stop(0),
        anthropic.block_start(1, {**anthropic.tool_use_block("call_9", "f", '{"a": 1}'), "input": {}}),
        anthropic.input_json_delta(1, '{"a": 1}'),
        anthropic.block_stop(1),
        anthropic.message_delta(anthropic.stop_reason(FINISHED, False), FINISHED.stop_sequence, USAGE),
        anthropic.message_stop(),
    ]
    parsed = [validated(RawMessageStreamEvent, dict(event)) for event in events]
    assert [event.type for event in parsed] == [event["type"] for event in events]
    assert parsed[-2].delta.stop_reason == "stop_sequence" and parsed[-2].delta.stop_sequence == "END"
    assert parsed[4].content_block.id == "toolu_9"
    assert anthropic.ping() == {"type": "ping"}  # not in RawMessageStreamEvent: the SDK skips it by name


def test_an_anthropic_message_is_the_sdks_message() -> None:
    content = [anthropic.text_block("Hi"), anthropic.tool_use_block("call_2", "f", "[1]")]
    body = anthropic.message("msg_2", "qwen", content, "tool_use", "ignored", USAGE)
    parsed = validated(AnthropicMessage, dict(body))
    assert parsed.stop_sequence is None  # only a stop_sequence reason names it
    assert parsed.content[1].input == {"arguments": [1]}  # input is always an object
    assert parsed.usage.input_tokens + parsed.usage.cache_read_input_tokens == 10


# ---- Responses ---------------------------------------------------------------------------------------


def _response(status: responses.Status, output: list[Any], usage: Any = None) -> responses.Response:
    return responses.response("resp_1", 1_700_000_000, status, "qwen", output, completed_at=None, usage=usage,
                              error=None, incomplete_reason="max_output_tokens" if status == "incomplete" else None,
                              echo=ResponsesRequest.model_validate({"input": "hi", "tools": [TOOL]}).echo(stored=True))


TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
# OpenAI's Responses carry `store` (whether the response is kept); the SDK's Response type does not list it.
RESPONSE_EXTRAS = (".response.store",)


def test_responses_events_are_response_stream_events() -> None:
    message = responses.message_item("msg_1", "in_progress", [])
    call = responses.function_call_item("fc_1", "completed", "call_1", "f", "{}")
    usage = responses.response_usage(Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=1))
    events = [
        responses.response_event("created", 0, _response("in_progress", [])),
        responses.response_event("in_progress", 1, _response("in_progress", [])),
        responses.output_item_event("added", 2, 0, message),
        responses.content_part_event("added", 3, "msg_1", 0, responses.text_part("")),
        responses.text_delta_event(4, "msg_1", 0, "Hi"),
        responses.text_done_event(5, "msg_1", 0, "Hi"),
        responses.content_part_event("done", 6, "msg_1", 0, responses.text_part("Hi")),
        responses.output_item_event("done", 7, 0, responses.message_item("msg_1", "completed",
                                                                          [responses.text_part("Hi")])),
        responses.output_item_event("added", 8, 1, {**call, "status": "in_progress", "arguments": ""}),
        responses.arguments_delta_event(9, "fc_1", 1, "{}"),
        responses.arguments_done_event(10, "fc_1", 1, "{}"),
        responses.output_item_event("done", 11, 1, call),
        responses.response_event("completed", 12, _response("completed", [message, call], usage)),
        responses.response_event("incomplete", 13, _response("incomplete", [message], usage)),
    ]
    parsed = [validated(ResponseStreamEvent, dict(event), RESPONSE_EXTRAS if "response" in event else ())
              for event in events]
    assert [event.type for event in parsed] == [event["type"] for event in events]
    assert [event.sequence_number for event in parsed] == list(range(len(events)))
    failed = _response("failed", [])
    failed["error"] = {"code": "server_error", "message": "engine stopped"}
    assert validated(Response, dict(failed), (".store",)).error.code == "server_error"


# ---- Ollama ------------------------------------------------------------------------------------------

# Keys the ollama python client's types do not list and drop: a tool call's id and index (as Ollama's server sends
# them) and a logprob's bytes (the entries are OpenAI's chat logprob entries).
OLLAMA_ONLY = {"id", "index", "bytes"}


def _without_go_only(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_go_only(v) for k, v in value.items() if k not in OLLAMA_ONLY}
    if isinstance(value, list):
        return [_without_go_only(item) for item in value]
    return value


@pytest.mark.parametrize("chat", [True, False])
def test_ollama_lines_are_the_clients_responses(chat: bool) -> None:
    kind = ollama.ChatResponse if chat else ollama.GenerateResponse
    call = ollama_answers.tool_call("call_1", 0, "f", {"a": 1})
    line = (ollama_answers.chat_line("qwen", "Hi", [call], False, LOGPROBS["content"]) if chat
            else ollama_answers.generate_line("qwen", "Hi", False, LOGPROBS["content"]))
    figures = ollama_answers.figures("stop", context=None if chat else [1, 2], total_ns=9, load_ns=0,
                                      prompt_tokens=5, prompt_ns=3, output_tokens=2, output_ns=4)
    last = {**(ollama_answers.chat_line("qwen", "", [], True) if chat
               else ollama_answers.generate_line("qwen", "", True)), **figures}
    for payload in (line, last, ollama_answers.done_answer("qwen", chat=chat, reason="load")):
        parsed = kind.model_validate(payload)
        # The client keeps every key it knows: nothing it knows was sent under another name.
        assert parsed.model_dump(exclude_unset=True, mode="json") == _without_go_only(dict(payload))


def test_ollama_embedding_answers_are_the_clients_responses() -> None:
    for payload in (ollama_answers.embed_answer("qwen", [[0.5, -1.0]], total_ns=9, load_ns=1, prompt_tokens=3),
                    ollama_answers.embed_answer("qwen", [])):
        parsed = ollama.EmbedResponse.model_validate(payload)
        assert parsed.model_dump(exclude_unset=True, mode="json") == dict(payload)
    for vector in ([0.5, -1.0], []):
        assert ollama.EmbeddingsResponse.model_validate(ollama_answers.embedding_answer(vector)).embedding == vector


def test_an_anthropic_token_count_is_the_sdks_message_tokens_count() -> None:
    assert validated(MessageTokensCount, dict(anthropic.token_count(12))).input_tokens == 12


# ---- OpenAI embeddings ---------------------------------------------------------------------------


def test_an_embedding_list_is_the_sdks_create_embedding_response() -> None:
    parsed = validated(CreateEmbeddingResponse, dict(embedding_list([[0.5, -1.0], [0.25, 2.0]], "qwen", 6)))
    assert [item.index for item in parsed.data] == [0, 1] and parsed.usage.total_tokens == 6
    # base64 strings are decoded by the SDK before it builds this type, so only the float form is checked here


def test_a_stored_input_item_page_is_the_sdks_response_item_list() -> None:
    item = {"id": "msg_1", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": "Hi"}]}
    parsed = validated(ResponseItemList, dict(responses.item_list([item], has_more=True)))
    assert (parsed.first_id, parsed.last_id, parsed.has_more) == ("msg_1", "msg_1", True)

    # An empty page has no first or last id: OpenAI sends null there (as on its other lists), which the SDK's type
    # (str) refuses when validating, but the SDK builds answers without validation (construct_type) and gets None.
    empty = responses.item_list([], has_more=False)
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    validated(ResponseItemList, {**empty, "first_id": "msg_1", "last_id": "msg_1"})  # every other key, strictly
    built = construct_type(type_=ResponseItemList, value=dict(empty))
    assert (built.data, built.first_id, built.last_id, built.has_more) == ([], None, None, False)


# ---- errors, as answers and inside streams ---------------------------------------------------------

FAILURES = [Failed(message="the engine stopped", code="engine_unavailable"),
            Failed(message="the prompt does not fit", code="context_length_exceeded"),
            Failed(message="grammar too costly", code="grammar_too_costly")]


@pytest.mark.parametrize("failed", FAILURES)
def test_an_openai_stream_error_is_the_sdks_error_object(failed: Failed) -> None:
    body = dict(error_body(failed))
    assert list(body) == ["error"]
    parsed = validated(ErrorObject, dict(body["error"]))
    assert parsed.code == failed.code and parsed.message == failed.message
    assert list(body["error"]) == ["message", "type", "param", "code"]  # explicit nulls, OpenAI's order


@pytest.mark.parametrize("failed", FAILURES)
def test_an_anthropic_error_event_is_the_sdks_error_response(failed: Failed) -> None:
    body = dict(failure_error(failed).anthropic_body())
    parsed = validated(AnthropicErrorResponse, body, (".error.details",))
    assert parsed.type == "error" and parsed.error.type in ("invalid_request_error", "overloaded_error")
    assert body["error"]["details"] == {"error_code": failed.code}


def test_an_anthropic_error_without_a_code_has_no_details() -> None:
    body = APIError(404, "no such model").anthropic_body()
    validated(AnthropicErrorResponse, dict(body))
    assert body == {"type": "error", "error": {"type": "not_found_error", "message": "no such model"}}


@pytest.mark.parametrize(("status", "openai_type", "anthropic_type"), [
    (400, "invalid_request_error", "invalid_request_error"), (401, "authentication_error", "authentication_error"),
    (403, "permission_error", "permission_error"), (404, "not_found_error", "not_found_error"),
    (408, "invalid_request_error", "invalid_request_error"), (409, "invalid_request_error", "invalid_request_error"),
    (413, "invalid_request_error", "request_too_large"), (429, "rate_limit_error", "rate_limit_error"),
    (431, "invalid_request_error", "invalid_request_error"), (499, "invalid_request_error", "invalid_request_error"),
    (500, "server_error", "api_error"), (503, "server_error", "overloaded_error"),
    (529, "server_error", "overloaded_error"),
])
def test_each_status_has_one_error_type_per_envelope(status: int, openai_type: str, anthropic_type: str) -> None:
    # One mapping for every sender (APIError's answers and the connection guard's raw ones): a 4xx that is not
    # named is the request's fault, never a server_error.
    assert openai_error_type(status) == openai_type and anthropic_error_type(status) == anthropic_type
    error = APIError(status, "m")
    assert error.openai_body()["error"]["type"] == openai_type
    assert error.anthropic_body()["error"]["type"] == anthropic_type


def test_the_documented_error_envelopes_read_the_sent_ones_back_unchanged() -> None:
    # The OpenAPI document's pydantic envelopes and the TypedDict ones that are sent cannot drift apart.
    sent_openai = dict(APIError(409, "busy", code="model_busy", param="model").openai_body())
    assert error_envelopes.ErrorResponse.model_validate(sent_openai).model_dump() == sent_openai
    sent_anthropic = dict(error_envelopes.anthropic_error("not_found_error", "no such model"))
    assert error_envelopes.AnthropicErrorResponse.model_validate(sent_anthropic).model_dump() == sent_anthropic
    sent_ollama = dict(ollama_error("model 'x' not found"))
    assert error_envelopes.OllamaErrorResponse.model_validate(sent_ollama).model_dump() == sent_ollama


def test_an_ollama_error_line_is_what_the_client_raises() -> None:
    # ollama's client raises ResponseError(line["error"]) for a line with an `error` key (it has no type for it)
    line = dict(ollama_error("model 'x' not found"))
    assert line == {"error": "model 'x' not found"}
    assert ollama.ResponseError(line["error"]).error == "model 'x' not found"


@pytest.mark.parametrize("status, code", [(400, "invalid_prompt"), (429, "rate_limit_exceeded"),
                                          (503, "server_error"), (500, "server_error")])
def test_a_failed_responses_error_is_the_sdks_response_error(status: int, code: str) -> None:
    parsed = validated(ResponseError, dict(responses.response_error("it failed", status)))
    assert parsed.code == code and parsed.message == "it failed"
