"""Request validation (api/protocol/) and the OpenAI error envelope (api/errors.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from edge_llm.api.errors import APIError, from_engine_error, from_pydantic, from_validation_errors
from edge_llm.api.params import ignored_fields_header, take_unknown
from edge_llm.api.protocol.common import MAX_STOP_STRINGS, SamplingDefaults
from edge_llm.api.protocol.openai_chat import ChatCompletionRequest, SimplePromptRequest
from edge_llm.prompting.chat_template import TemplateError
from edge_llm.engine.types import EngineUnavailableError, QueueFullError

DEFAULTS = SamplingDefaults(temperature=0.7, top_p=0.9, top_k=40, max_tokens=128)
USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def error_of(**fields) -> APIError:
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    return from_pydantic(info.value)


# ---- chat requests ---------------------------------------------------------------------------------


def test_chat_defaults() -> None:
    request = chat()
    assert request.stream is False
    assert request.n == 1
    assert request.stop_strings() == ()
    params = request.sampling_params(DEFAULTS)
    assert params.temperature == 0.7
    assert params.top_p == 0.9
    assert params.top_k == 40 and params.min_p == 0.0 and params.seed is None
    assert chat(top_k=0).sampling_params(DEFAULTS).top_k == 0  # an explicit 0 turns the default off
    assert params.ignore_eos is False and chat(ignore_eos=True).sampling_params(DEFAULTS).ignore_eos is True
    assert params.repeat_penalty == 1.0 and params.presence_penalty == 0.0
    assert request.requested_max_tokens(DEFAULTS) is None  # no max_tokens: until the answer ends or the context
    assert chat(max_completion_tokens=7, max_tokens=9).requested_max_tokens(DEFAULTS) == 7


def test_chat_explicit_values_override_defaults() -> None:
    request = chat(temperature=0, top_p=1, max_tokens=5, seed=42, top_k=40, min_p=0.05, repeat_penalty=1.1)
    params = request.sampling_params(DEFAULTS)
    assert params.temperature == 0.0 and params.greedy
    assert params.top_p == 1.0
    assert params.seed == 42 and params.top_k == 40 and params.min_p == 0.05 and params.repeat_penalty == 1.1
    assert request.requested_max_tokens(DEFAULTS) == 5
    # max_completion_tokens wins over the legacy max_tokens
    assert chat(max_tokens=5, max_completion_tokens=9).requested_max_tokens(DEFAULTS) == 9


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("temperature", [0, 0.0, 1.3, 2, 2.0], [-0.01, 2.01, 5]),
        ("top_p", [0.001, 0.5, 1, 1.0], [0, 0.0, -0.1, 1.01]),
        ("max_tokens", [1, 4096], [0, -1]),
        ("max_completion_tokens", [1], [0]),
        ("top_k", [0, 50], [-1]),
        ("min_p", [0, 1], [-0.1, 1.1]),
        ("presence_penalty", [-2, 2], [-2.1, 2.1]),
        ("frequency_penalty", [-2, 0, 2], [3]),
        ("repeat_penalty", [0.5, 10], [0, 10.5]),
        ("n", [1], [0, -1, 1000]),
    ],
)
def test_chat_ranges(field: str, good: list, bad: list) -> None:
    for value in good:
        assert getattr(chat(**{field: value}), field) == value
    for value in bad:
        error = error_of(**{field: value})
        assert error.status == 400
        assert error.param == field
        assert error.code == "invalid_value"
        assert error.message.startswith(f"Invalid value for '{field}'")


def test_unknown_keys_at_every_depth_are_collected_with_their_paths_and_dropped() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "y", "annotations": [], "audio": None},
            {"role": "user", "content": "z"},
        ],
        "frobnicate": True,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x-any": 1}},
                   "cache_control": {}}],
    }
    request = ChatCompletionRequest.model_validate(body)
    assert take_unknown(request) == ["frobnicate", "messages.0.content.0.cache_control", "messages.1.annotations",
                                     "messages.1.audio", "tools.0.cache_control"]
    assert take_unknown(request) == []  # dropped: nothing downstream sees them
    # Keys that look like numbers to str.isdigit but are not integers ("²", "①") sort as text (a 500 before)
    odd = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "²": 1, "①": 2, "10": 3})
    assert sorted(take_unknown(odd)) == sorted(["10", "①", "²"])
    assert "annotations" not in request.messages[1].model_dump()
    assert request.tools[0].function.parameters["x-any"] == 1  # a schema is data, not a request key
    # Keys that look like digits to str.isdigit but are not integers (found by fuzzing: once a 500) sort as text.
    odd = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "³": 1, "2": 1})
    assert take_unknown(odd) == ["2", "³"]


def test_ignored_fields_header_is_ascii_and_capped() -> None:
    paths = [f"messages.{index}.x\n,é" for index in range(40)]
    header = ignored_fields_header(paths).decode("ascii")
    assert header.count(",") == 32  # 32 paths, then the count of the rest
    assert header.endswith(",...+8") and "%2C" in header and "%C3%A9" in header


def test_an_error_inside_a_union_names_the_body_path_not_the_union_branch() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    error = from_pydantic(info.value, body)
    assert error.param == "messages.0.content.0.text"
    assert "valid string" in error.message
    body = {"messages": [{"role": "user", "content": 5}]}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    error = from_pydantic(info.value, body)
    assert error.param == "messages.0.content"
    assert "valid string" in error.message and "valid list" in error.message


def test_a_missing_key_is_named() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    assert from_pydantic(info.value, body).param == "tools.0.function.name"


def test_ignored_openai_fields_are_accepted_unreported_and_change_nothing() -> None:
    fields = {"user": "u1", "metadata": {"k": "v"}, "store": True, "service_tier": "flex"}
    request = chat(max_tokens=5, stop="###", **fields)
    plain = chat(max_tokens=5, stop="###")
    # Known to the protocol (README: "ignored", not "ignored (reported)"): no X-Edge-LLM-Ignored-Fields entry and
    # no 400 under --strict-params, which both come from take_unknown.
    assert take_unknown(request) == []
    # Nothing the engine receives differs from the same request without them.
    assert request.sampling_params(DEFAULTS) == plain.sampling_params(DEFAULTS)
    assert request.requested_max_tokens(DEFAULTS) == plain.requested_max_tokens(DEFAULTS)
    assert request.stop_strings() == plain.stop_strings() and request.messages == plain.messages


def test_stop_accepts_a_string_or_as_many_as_clients_send_up_to_the_limit() -> None:
    assert chat(stop="###").stop_strings() == ("###",)
    many = [f"<stop{index}>" for index in range(MAX_STOP_STRINGS)]
    assert chat(stop=many).stop_strings() == tuple(many)
    assert chat(stop=[]).stop_strings() == ()
    error = error_of(stop=many + ["one more"])
    assert error.param == "stop"
    assert f"at most {MAX_STOP_STRINGS}" in error.message


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "tool", "content": "x"}],
        [{"role": "user"}],
        [{"role": "user", "content": None}],
        [{"content": "no role"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    ],
)
def test_bad_messages_are_rejected(messages) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"messages": messages})
    error = from_pydantic(info.value)
    assert error.status == 400
    assert error.param is not None and error.param.startswith("messages")


def test_missing_messages() -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({})
    assert from_pydantic(info.value).param == "messages"


def test_developer_role_maps_to_system_and_parts_are_joined() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "rules"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "c", "name": "bot"},
            ]
        }
    )
    messages = request.to_messages()
    assert [(m["role"], m["content"]) for m in messages] == [("system", "rules"), ("user", "ab"), ("assistant", "c")]
    assert request.messages[0].role == "developer"  # the request itself is unchanged


def test_stream_options() -> None:
    assert chat(stream=True, stream_options={"include_usage": True}).stream_options.include_usage is True
    request = chat(stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert request.include_usage and take_unknown(request) == ["stream_options.continuous_usage_stats"]


def test_wrong_types() -> None:
    error = error_of(temperature="hot")
    assert error.param == "temperature"
    assert error_of(stream="maybe").param == "stream"


# ---- the simple prompt body -------------------------------------------------------------------------


def test_simple_prompt_request_defaults_and_overrides() -> None:
    request = SimplePromptRequest.model_validate({"prompt": "Tell me"})
    assert request.to_messages() == [{"role": "user", "content": "Tell me"}]
    params = request.sampling_params(DEFAULTS)
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.9, 40)
    assert request.requested_max_tokens(DEFAULTS) == 128
    request = SimplePromptRequest.model_validate({"prompt": "x", "temperature": 0, "top_p": 0.5, "max_tokens": 3})
    params = request.sampling_params(DEFAULTS)
    assert (params.temperature, params.top_p) == (0.0, 0.5)
    assert request.requested_max_tokens(DEFAULTS) == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   \n"}, "prompt"),
        ({"prompt": "x", "temperature": 2.5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ],
)
def test_simple_prompt_request_validation(body: dict, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        SimplePromptRequest.model_validate(body)
    assert from_pydantic(info.value).param == param


# ---- the error envelope ----------------------------------------------------------------------------


def test_from_validation_errors_strips_the_body_prefix() -> None:
    errors = [{"loc": ("body", "temperature"), "msg": "Input should be less than or equal to 2", "type": "less_than_equal"}]
    error = from_validation_errors(errors)
    assert error.param == "temperature"
    assert error.message == "Invalid value for 'temperature': Input should be less than or equal to 2"
    body = json.loads(error.response().body)
    assert body == {
        "error": {
            "message": "Invalid value for 'temperature': Input should be less than or equal to 2",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    assert error.response().status_code == 400
    # without stripping, the location is kept
    assert from_validation_errors(errors, skip_body_prefix=False).param == "body.temperature"


def test_from_validation_errors_nested_location_and_first_error_wins() -> None:
    errors = [
        {"loc": ("body", "messages", 0, "role"), "msg": "bad role", "type": "literal_error"},
        {"loc": ("body", "temperature"), "msg": "too hot", "type": "less_than_equal"},
    ]
    error = from_validation_errors(errors)
    assert error.param == "messages.0.role"
    assert "bad role" in error.message


def test_from_validation_errors_invalid_json_and_unknown_field() -> None:
    error = from_validation_errors([{"loc": ("body", 12), "msg": "JSON decode error", "type": "json_invalid"}])
    assert error.code == "invalid_json" and error.status == 400
    assert error.param is None
    error = from_validation_errors([{"loc": ("body", "foo"), "msg": "Extra inputs", "type": "extra_forbidden"}])
    assert error.code == "unknown_parameter"
    assert error.param == "foo"
    assert error.message == "Unrecognized request argument supplied: foo"


def test_from_validation_errors_without_location_or_errors() -> None:
    error = from_validation_errors([{"loc": ("body",), "msg": "Field required", "type": "missing"}])
    assert error.param is None
    assert error.message == "Field required"
    error = from_validation_errors([])
    assert error.status == 400 and error.message == "invalid request"


def test_engine_errors_map_to_503_and_template_errors_to_400() -> None:
    full = from_engine_error(QueueFullError("full"))
    assert (full.status, full.code, full.headers) == (503, "queue_full", {"Retry-After": "1"})
    assert full.error_type == "server_error"
    down = from_engine_error(EngineUnavailableError("down"))
    assert (down.status, down.code) == (503, "engine_unavailable")
    bad = from_engine_error(TemplateError("nope"))
    assert (bad.status, bad.code, bad.param, bad.error_type) == (400, "chat_template_error", "messages", "invalid_request_error")
    with pytest.raises(RuntimeError):
        from_engine_error(RuntimeError("other"))


def test_response_carries_headers() -> None:
    response = from_engine_error(QueueFullError("full")).response()
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert json.loads(response.body)["error"]["code"] == "queue_full"
