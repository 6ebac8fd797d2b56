"""The OpenAI API surface with the official client: completions, stop, seed, n, logprobs, formats, tools."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionTokenLogprob

from edge_llm.testing.server import RunningServer

COUNT = [{"role": "user", "content": "Count from 1 to 12, separated by commas and spaces. Only the numbers."}]

# Tests that compare the exact text of two requests use `repeatable_client`: a server that runs one request at a
# time without a prefix cache, the only place where the same temperature-0 or seeded request is guaranteed to give
# the same text (docs/api/openai.md, `seed`). Elsewhere prompt KV from the cache and batch mates can change the rounding.


def stream_text(client: openai.OpenAI, **kwargs: Any) -> str:
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                   if c.choices)


# ---- completions ------------------------------------------------------------------------------


def test_text_completion_streamed_and_not(repeatable_client: openai.OpenAI, model_id: str) -> None:
    client = repeatable_client
    whole = client.completions.create(model=model_id, prompt="def add(a, b):", max_tokens=16, temperature=0)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt="def add(a, b):", max_tokens=16, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text
    assert whole.usage.completion_tokens <= 16


def test_text_completion_with_several_prompts_and_echo(client: openai.OpenAI, model_id: str) -> None:
    prompts = ["The capital of France is", "def square(x):"]
    result = client.completions.create(model=model_id, prompt=prompts, max_tokens=8, temperature=0, echo=True)
    assert [c.index for c in result.choices] == [0, 1]
    for prompt, choice in zip(prompts, result.choices):
        assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)


def test_token_id_prompts_answer_as_their_text(repeatable_client: openai.OpenAI, repeatable_server: RunningServer,
                                               model_id: str) -> None:
    """OpenAI's `prompt: list[int]` (the ids of the text): under greedy decoding the same answer as the text."""
    text = "def add(a, b):"
    ids = httpx.post(repeatable_server.url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    ask = {"model": model_id, "max_tokens": 8, "temperature": 0}
    by_text = repeatable_client.completions.create(prompt=text, **ask)
    by_ids = repeatable_client.completions.create(prompt=ids, echo=True, **ask)
    assert by_ids.choices[0].text == text + by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)


def test_a_token_id_prompt_with_suffix_fills_the_middle_as_its_text(repeatable_client: openai.OpenAI,
                                                                    repeatable_server: RunningServer,
                                                                    model_id: str) -> None:
    """A token-id prompt with `suffix` is laid out for fill-in-the-middle as its text is: the same greedy answer."""
    text = "def add(a, b):\n    return "
    ids = httpx.post(repeatable_server.url + "/tokenize", json={"content": text}, timeout=60).json()["tokens"]
    ask = {"model": model_id, "max_tokens": 6, "temperature": 0, "suffix": "\n\nprint(add(1, 2))\n"}
    by_text = repeatable_client.completions.create(prompt=text, **ask).choices[0].text
    assert by_text.strip()
    assert repeatable_client.completions.create(prompt=ids, **ask).choices[0].text == by_text


def test_several_token_id_prompts_give_a_choice_each_indexed_prompt_by_n(client: openai.OpenAI, server: RunningServer,
                                                                          model_id: str) -> None:
    """`prompt: list[list[int]]` with n: choice index = prompt position × n + j, as OpenAI numbers them; streamed
    interleaved with the same indices."""
    texts = ["The capital of France is", "def square(x):"]
    ids = [httpx.post(server.url + "/tokenize", json={"content": t}, timeout=60).json()["tokens"] for t in texts]
    ask = {"model": model_id, "prompt": ids, "n": 2, "max_tokens": 6, "temperature": 0.8, "echo": True}
    whole = client.completions.create(**ask)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    for choice in whole.choices:
        assert choice.text.startswith(texts[choice.index // 2]) and choice.finish_reason in ("stop", "length")
    streamed: dict[int, str] = {}
    finished: set[int] = set()
    for chunk in client.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert sorted(streamed) == [0, 1, 2, 3] and finished == {0, 1, 2, 3}
    assert all(streamed[index].startswith(texts[index // 2]) for index in streamed)


@pytest.mark.parametrize(("prompt", "param"), [
    ([1, 10**9], "prompt.1"), ([-1], "prompt.0"), ([[9707], [9707, 10**12]], "prompt.1.1"), ([], "prompt"),
    ([[]], "prompt"), (["Hi", ""], "prompt"), ([[9707]] * 17, "prompt"), ([True], "prompt"), ([1.5], "prompt"),
])
def test_unreadable_prompts_are_a_400_naming_the_prompt(client: openai.OpenAI, model_id: str, prompt: Any,
                                                        param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model_id, prompt=prompt, max_tokens=2)
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param, error


# ---- stop, seed, n ------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["7", ["9", ", 6"], ", 5,"])
def test_stop_text_never_reaches_the_client(repeatable_client: openai.OpenAI, model_id: str, stop: Any) -> None:
    client = repeatable_client
    whole = client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=60, temperature=0, stop=stop)
    text = whole.choices[0].message.content
    streamed = stream_text(client, model=model_id, messages=COUNT, max_tokens=60, temperature=0, stop=stop)
    full = client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=60, temperature=0)
    stops = [stop] if isinstance(stop, str) else stop
    cut = min(full.choices[0].message.content.find(s) for s in stops if s in full.choices[0].message.content)
    assert text == full.choices[0].message.content[:cut]
    assert whole.choices[0].finish_reason == "stop"
    assert streamed == text
    assert not any(s in text for s in stops)


def test_seed_makes_sampling_repeatable_alone_without_prefix_cache(repeatable_client: openai.OpenAI,
                                                                   model_id: str) -> None:
    client = repeatable_client
    ask = dict(model=model_id, messages=[{"role": "user", "content": "Invent a name for a fantasy city."}],
               max_tokens=20, temperature=1.2, top_p=1.0)
    first = client.chat.completions.create(seed=1234, **ask).choices[0].message.content
    again = client.chat.completions.create(seed=1234, **ask).choices[0].message.content
    others = {client.chat.completions.create(seed=s, **ask).choices[0].message.content for s in (1, 2, 3)}
    assert first == again
    assert len(others | {first}) > 1


def test_n_choices_share_one_prefill(client: openai.OpenAI, model_id: str) -> None:
    result = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Write a one-line slogan for a bakery."}],
        max_tokens=20, temperature=1.0, n=3, seed=7,
    )
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") and c.message.content for c in result.choices)
    assert len({c.message.content for c in result.choices}) > 1
    single = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Write a one-line slogan for a bakery."}],
        max_tokens=20, temperature=1.0, seed=7,
    )
    assert result.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once, not three times


def test_n_choices_streamed(client: openai.OpenAI, model_id: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Name a fruit."}], max_tokens=8, temperature=1.0,
        n=2, seed=3, stream=True))
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason}
    assert set(finished) == {0, 1}


# ---- sampling fields -------------------------------------------------------------------------------


def test_logit_bias_bans_a_token(client: openai.OpenAI, server: RunningServer, model_id: str) -> None:
    ask = dict(model=model_id, messages=[{"role": "user", "content": "Say exactly: Hello world"}], max_tokens=6,
               temperature=0)
    plain = client.chat.completions.create(logprobs=True, **ask)
    first_token = plain.choices[0].logprobs.content[0].token
    token_id = httpx.post(server.url + "/tokenize", json={"content": first_token}).json()["tokens"][0]
    banned = client.chat.completions.create(logit_bias={str(token_id): -100}, logprobs=True, **ask)
    assert banned.choices[0].logprobs.content[0].token != first_token


def test_top_k_and_min_p_change_nothing_at_greedy_and_each_penalty_cuts_repetition(
    repeatable_client: openai.OpenAI, model_id: str
) -> None:
    """Penalties apply at temperature 0 too (they reshape the logits before the pick): on a counting answer, whose
    ", " repeats, each of them on its own makes the answer repeat less; neutral values change nothing."""
    client = repeatable_client
    ask = dict(model=model_id, messages=COUNT, max_tokens=40, temperature=0)

    def answer(**fields: Any) -> str:
        return client.chat.completions.create(**ask, **fields).choices[0].message.content or ""

    plain = answer()
    assert plain.count(",") >= 8, plain  # the repetition the penalties act on
    assert answer(extra_body={"top_k": 40, "min_p": 0.05}) == plain
    assert answer(frequency_penalty=0.0, presence_penalty=0.0, extra_body={"repeat_penalty": 1.0}) == plain
    for fields in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"extra_body": {"repeat_penalty": 1.5}}):
        penalised = answer(**fields)
        assert penalised.count(",") < plain.count(","), (fields, plain, penalised)


def test_chat_logprobs_have_openai_shape(client: openai.OpenAI, model_id: str) -> None:
    result = client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=10, temperature=0,
                                            logprobs=True, top_logprobs=3)
    content = result.choices[0].logprobs.content
    assert len(content) == result.usage.completion_tokens or len(content) == result.usage.completion_tokens - 1
    for entry in content:
        ChatCompletionTokenLogprob.model_validate(entry.model_dump())
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the likeliest
        assert bytes(entry.bytes).decode() == entry.token
    assert "".join(e.token for e in content) == result.choices[0].message.content
    streamed = [c for c in client.chat.completions.create(
        model=model_id, messages=COUNT, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2, stream=True)
        if c.choices and c.choices[0].delta.content]
    assert all(c.choices[0].logprobs.content for c in streamed)


def test_completion_logprobs_have_legacy_shape(client: openai.OpenAI, model_id: str) -> None:
    result = client.completions.create(model=model_id, prompt="1, 2, 3,", max_tokens=6, temperature=0, logprobs=2)
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert "".join(logprobs.tokens) == result.choices[0].text
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    assert all(len(top) == 2 for top in logprobs.top_logprobs)


def test_max_completion_tokens_and_include_usage(client: openai.OpenAI, model_id: str) -> None:
    result = client.chat.completions.create(model=model_id, messages=COUNT, max_completion_tokens=5, temperature=0)
    assert result.usage.completion_tokens == 5 and result.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=5, temperature=0,
                                                stream=True))
    assert all(c.usage is None and c.choices for c in plain)


# ---- structured output ------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 15}, "maxItems": 3},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def test_json_schema_output_always_validates(client: openai.OpenAI, model_id: str) -> None:
    documents = []
    for seed in range(5):
        result = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=80,
            temperature=1.0, seed=seed, n=4,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        )
        documents += [c.message.content for c in result.choices]
    assert len(documents) == 20
    for text in documents:
        jsonschema.validate(json.loads(text), PERSON)
        # Every property is required, so each document has them all, in the schema's order (not sorted by name).
        assert list(json.loads(text)) == list(PERSON["properties"])


def test_json_object_mode(client: openai.OpenAI, model_id: str) -> None:
    # The object usually takes ~40 tokens, but how long it gets depends on what the prefix cache held (one run
    # wrote a longer one that 60 tokens cut short): room enough for it to end by its grammar.
    result = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Give me a JSON object about a car."}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"})
    choice = result.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


# ---- tools ---------------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                         "parameters": {"type": "object",
                                                        "properties": {"timezone": {"type": "string"}}}}}


def test_tool_call_round_trip(client: openai.OpenAI, model_id: str) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER, TIME],
                                           tool_choice="required", temperature=0, max_tokens=60)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict)
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 22})}]
    final = client.chat.completions.create(model=model_id, messages=messages, tools=[WEATHER, TIME],
                                           tool_choice="none", temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None
    assert "22" in final.choices[0].message.content


def test_named_tool_choice_is_enforced_and_streams(client: openai.OpenAI, model_id: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Tell me a joke."}], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0, max_tokens=60,
        stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_time" and calls[0].index == 0
    json.loads(calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_auto_tool_choice_parses_model_tool_calls(client: openai.OpenAI, model_id: str) -> None:
    """No grammar forces a call here (tool_choice is auto): the model writes its call as text, which the server
    parses into tool_calls. The model answers this prompt with a call (greedy, every time measured)."""
    ask: dict[str, Any] = dict(model=model_id, tools=[WEATHER], temperature=0, max_tokens=60,
                               messages=[{"role": "user", "content": "Use the tool to get the weather in Tokyo."}])
    result = client.chat.completions.create(**ask)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Tokyo"}
    assert not choice.message.content  # the call's text is not also sent as content
    chunks = list(client.chat.completions.create(stream=True, **ask))
    streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed if tc.function.name] == ["get_weather"]
    assert json.loads("".join(tc.function.arguments or "" for tc in streamed)) == {"city": "Tokyo"}
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


# ---- models, tokenizer, strictness ---------------------------------------------------------------------


def test_models_by_id_and_file_name(server: RunningServer, model_id: str) -> None:
    assert httpx.get(f"{server.url}/v1/models/{model_id}").json()["id"] == model_id
    assert httpx.get(f"{server.url}/v1/models/{model_id}.gguf").status_code == 200
    missing = httpx.get(f"{server.url}/v1/models/llama-70b")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_tokenize_round_trip(server: RunningServer) -> None:
    tokens = httpx.post(server.url + "/tokenize", json={"content": "Hello, edge! 🚀"}).json()["tokens"]
    assert len(tokens) > 3
    assert httpx.post(server.url + "/detokenize", json={"tokens": tokens}).json()["content"] == "Hello, edge! 🚀"
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [1, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens.1"


def test_harmless_fields_are_accepted(client: openai.OpenAI, model_id: str) -> None:
    result = client.chat.completions.create(model=model_id, messages=COUNT, max_tokens=3, user="u-1",
                                            metadata={"k": "v"}, store=False, parallel_tool_calls=True)
    assert result.choices[0].message.content


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"n": 0}, "n"),
    ({"n": 100}, "n"),
    ({"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"stop": [f"s{i}" for i in range(65)]}, "stop"),
    ({"logit_bias": {"999999999": 5}}, "logit_bias"),
    ({"logit_bias": {"12": 500}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"seed": "abc"}, "seed"),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages.0.name"),  # (top-level unknowns: ignored)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}}, "response_format"),
]


@pytest.mark.parametrize(("fields", "param"), INVALID, ids=[p for _, p in INVALID])
def test_invalid_values_name_the_field(server: RunningServer, model_id: str, fields: dict[str, Any],
                                       param: str) -> None:
    body = {"model": model_id, "messages": COUNT, "max_tokens": 3, **fields}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param or param in error["message"], error
    ok = httpx.post(server.url + "/v1/chat/completions", json={"messages": COUNT, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200


def test_ignore_eos_runs_the_answer_to_max_tokens(repeatable_client: openai.OpenAI, model_id: str) -> None:
    client = repeatable_client  # the forced answer is compared with the natural one
    ask = dict(model=model_id, messages=[{"role": "user", "content": "Reply with the single word OK."}],
               max_tokens=40, temperature=0)
    natural = client.chat.completions.create(**ask)
    assert natural.choices[0].finish_reason == "stop" and natural.usage.completion_tokens < 40
    forced = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens == 40
    assert forced.choices[0].message.content.startswith(natural.choices[0].message.content)
