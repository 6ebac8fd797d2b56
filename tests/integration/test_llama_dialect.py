"""What clients written for llama-server (and other servers) send: unknown fields, llama-server's native fields,
routes without /v1, /health, and tool calls the default model writes without their tags."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import unquote

import httpx
import openai
import pytest

from edge_llm.testing.server import RunningServer, run_server
from tests.helpers import chat_body

CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("strict"), "--strict-params", "--parallel", "1", "--ctx-size", "512",
                    "--cache-slots", "0", "--model-alias", "my-llama") as running:
        yield running


def test_unknown_fields_are_ignored_and_named_in_a_header(server: RunningServer) -> None:
    response = httpx.post(server.url + CHAT, json=chat_body(id_slot=0, samplers=["top_k"], use_beam_search=False),
                          timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-edge-llm-ignored-fields"] == "id_slot,samplers,use_beam_search"
    assert response.json()["choices"][0]["message"]["content"] is not None
    plain = httpx.post(server.url + CHAT, json=chat_body(), timeout=60)
    assert "x-edge-llm-ignored-fields" not in plain.headers
    completion = httpx.post(server.url + "/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 2,
                                                                  "typical_p": 1.0}, timeout=60)
    assert completion.status_code == 200 and completion.headers["x-edge-llm-ignored-fields"] == "typical_p"


def test_any_unknown_field_name_fits_in_the_header(server: RunningServer) -> None:
    """A JSON key may hold control characters, commas and any Unicode; the header names it percent-encoded (the
    fuzzer found a raw one made the HTTP layer drop the response)."""
    hostile = {"\t\x1bé,😀": 1, "a b": [], "id_slot": 0}
    for path, body in ((CHAT, chat_body(**hostile)), ("/tokenize", {"content": "hi", **hostile})):
        response = httpx.post(server.url + path, json=body, timeout=60)
        assert response.status_code == 200, response.text
        names = response.headers["x-edge-llm-ignored-fields"].split(",")
        assert [unquote(name) for name in names] == sorted(hostile), names
        assert all(ch.isascii() and ch.isprintable() for ch in response.headers["x-edge-llm-ignored-fields"])


# What SDKs and agents add to an echoed assistant turn and to content parts (openai-python's ChatCompletionMessage
# dumped back: annotations, audio, refusal, function_call; Cline and Roo Code: cache_control on a text part).
ECHOED_TURNS = [
    {"role": "user", "content": [{"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": "Hi!", "annotations": [], "audio": None, "refusal": None, "function_call": None},
    {"role": "user", "content": "Again."},
]


def test_unknown_keys_inside_messages_and_parts_are_ignored_and_named(server: RunningServer) -> None:
    response = httpx.post(server.url + CHAT, json={**chat_body(), "messages": ECHOED_TURNS}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-edge-llm-ignored-fields"].split(",") == [
        "messages.0.content.0.cache_control", "messages.1.annotations", "messages.1.audio",
        "messages.1.function_call"]  # refusal is a field of OpenAI's assistant message, known here
    assert response.json()["choices"][0]["message"]["content"] is not None


def test_strict_params_refuses_unknown_fields(strict_server: RunningServer) -> None:
    response = httpx.post(strict_server.url + CHAT, json=chat_body(id_slot=0), timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_parameter" and response.json()["error"]["param"] == "id_slot"
    nested = httpx.post(strict_server.url + CHAT, json={**chat_body(), "messages": ECHOED_TURNS}, timeout=60)
    assert nested.status_code == 400
    assert nested.json()["error"]["param"] == "messages.0.content.0.cache_control"


def test_the_model_alias_names_the_model_on_llama_servers_routes(strict_server: RunningServer) -> None:
    # llama-server's --alias: /props and /completion answer with it, as llama.vscode and scripts read it.
    assert httpx.get(strict_server.url + "/props", timeout=60).json()["model_alias"] == "my-llama"
    answer = httpx.post(strict_server.url + "/completion", timeout=120,
                        json={"model": "my-llama", "prompt": "1, 2,", "n_predict": 2}).json()
    assert answer["model"] == "my-llama"


def test_routes_without_v1_and_health(server: RunningServer, model_id: str) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)  # no /v1
    answer = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=2)
    assert answer.choices[0].message.content is not None
    assert client.completions.create(model=model_id, prompt="1, 2,", max_tokens=2).choices[0].text is not None
    assert [m.id for m in client.models.list()] == [model_id]
    health = httpx.get(server.url + "/health", timeout=60)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_n_predict_bounds_the_answer(server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "Count from 1 to 50."}], "temperature": 0, "n_predict": 5}
    result = httpx.post(server.url + CHAT, json=body, timeout=60).json()
    assert result["usage"]["completion_tokens"] == 5 and result["choices"][0]["finish_reason"] == "length"
    completion = httpx.post(server.url + "/completions", json={"prompt": "1, 2, 3,", "n_predict": 3},
                            timeout=60).json()
    assert completion["usage"]["completion_tokens"] == 3


def test_a_gbnf_grammar_and_a_json_schema_shape_the_answer(server: RunningServer) -> None:
    ask = {"messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}], "temperature": 0.8,
           "max_tokens": 8}
    for _ in range(3):
        answer = httpx.post(server.url + CHAT, json={**ask, "grammar": 'root ::= "yes" | "no"'}, timeout=60).json()
        assert answer["choices"][0]["message"]["content"] in ("yes", "no")
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["blue", "red"]}},
              "required": ["colour"]}
    shaped = httpx.post(server.url + "/v1/completions", timeout=60,
                        json={"prompt": "The sky as JSON:", "json_schema": schema, "max_tokens": 32}).json()
    assert json.loads(shaped["choices"][0]["text"])["colour"] in ("blue", "red")
    broken = httpx.post(server.url + CHAT, json={**ask, "grammar": "root ::= (("}, timeout=60)
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "grammar"
    both = httpx.post(server.url + CHAT, json={**ask, "grammar": 'root ::= "a"', "json_schema": schema}, timeout=60)
    assert both.status_code == 400


def test_cache_prompt_false_neither_reuses_nor_leaves_a_cache_entry(server: RunningServer) -> None:
    content = "Name three prime numbers. " + "Be brief. " * 40
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0}
    uncached = httpx.post(server.url + CHAT, json={**body, "cache_prompt": False}, timeout=60).json()
    again = httpx.post(server.url + CHAT, json={**body, "cache_prompt": False}, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert uncached["usage"]["prompt_tokens"] == again["usage"]["prompt_tokens"]
    httpx.post(server.url + CHAT, json=body, timeout=60)  # the default: leaves an entry
    cached = httpx.post(server.url + CHAT, json=body, timeout=60).json()
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] > cached["usage"]["prompt_tokens"] // 2


def test_n_probs_returns_logprobs(server: RunningServer) -> None:
    result = httpx.post(server.url + CHAT, json=chat_body(n_probs=3), timeout=60).json()
    entries = result["choices"][0]["logprobs"]["content"]
    assert entries and all(len(entry["top_logprobs"]) == 3 for entry in entries)


def test_auto_tool_choice_turns_a_bare_call_into_tool_calls(client: openai.OpenAI, model_id: str) -> None:
    """The default model answers an auto tool choice with a bare `{"name", "arguments"}` object, no tags."""
    ask = {"model": model_id, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
           "tools": [WEATHER], "tool_choice": "auto", "temperature": 0, "max_tokens": 60}
    result = client.chat.completions.create(**ask)
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    with client.chat.completions.create(stream=True, **ask) as stream:
        chunks = list(stream)
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in streamed] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    prose = client.chat.completions.create(**{**ask, "messages": [{"role": "user", "content": "Say hello."}]})
    assert prose.choices[0].finish_reason != "tool_calls" or prose.choices[0].message.tool_calls


# ---- llama-server's own routes: /completion, /props, /slots (issue 37) ----------------------------------------------


def test_completion_answers_as_llama_server_does(server: RunningServer, model_id: str) -> None:
    # The body of llama.cpp's own tools/server/tests/unit/test_completion.py, with fields its clients add.
    body = {"prompt": "I believe the meaning of life is", "n_predict": 8, "temperature": 0, "seed": 42,
            "samplers": ["top_k", "temperature"], "id_slot": -1, "t_max_prompt_ms": 500}
    response = httpx.post(server.url + "/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["content"] and answer["stop"] is True and answer["model"] == model_id
    assert 0 < answer["tokens_predicted"] <= 8 and answer["tokens_evaluated"] > 5
    assert answer["stop_type"] in ("eos", "limit", "word") and answer["truncated"] is False
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"]
    assert set(response.headers["x-edge-llm-ignored-fields"].split(",")) == {"samplers", "id_slot"}


def test_completion_echoes_its_prompt_and_settings_and_names_the_stop_word(server: RunningServer) -> None:
    body = {"prompt": "Count: 1, 2, 3,", "n_predict": 12, "temperature": 0, "seed": 42, "stop": [","]}
    answer = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert answer["stop_type"] == "word" and answer["stopping_word"] == "," and "," not in answer["content"]
    assert answer["prompt"] == body["prompt"]
    settings = answer["generation_settings"]
    assert settings["n_predict"] == 12 and settings["temperature"] == 0 and settings["seed"] == 42
    assert settings["stop"] == [","] and settings["n_ctx"] > 0
    unbounded = httpx.post(server.url + "/completion", timeout=120,
                           json={"prompt": "Hi", "n_predict": 2, "temperature": 0}).json()
    assert unbounded["stop_type"] in ("limit", "eos") and unbounded["stopping_word"] == ""


def test_ignore_eos_runs_the_answer_to_n_predict_and_shows_the_banned_end_tokens(server: RunningServer) -> None:
    # a turn the model closes at once: "OK" then its end token
    body = {"prompt": "<|im_start|>user\nReply with just OK.<|im_end|>\n<|im_start|>assistant\n", "n_predict": 24,
            "temperature": 0}
    ends = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert ends["stop_type"] == "eos" and ends["tokens_predicted"] < 24
    assert ends["generation_settings"]["logit_bias"] == []
    runs_on = httpx.post(server.url + "/completion", json={**body, "ignore_eos": True}, timeout=120)
    assert "x-edge-llm-ignored-fields" not in runs_on.headers
    answer = runs_on.json()
    assert answer["stop_type"] == "limit" and answer["tokens_predicted"] == 24
    end_token = httpx.post(server.url + "/tokenize", json={"content": "<|im_end|>", "parse_special": True},
                           timeout=60).json()["tokens"]
    banned = answer["generation_settings"]["logit_bias"]
    assert all(entry["bias"] is None for entry in banned) and end_token[0] in {entry["token"] for entry in banned}


def test_completion_streams_prompt_progress_when_asked(small_chunks_server: RunningServer) -> None:
    # ~350 tokens never seen before: several prefill chunks of at most --batch-size (64) tokens.
    text = " ".join(f"Item {i}: the colour of box {i * 41 % 103} is code {i * 67 % 991}." for i in range(24))
    body = {"prompt": text, "n_predict": 2, "stream": True, "return_progress": True}
    with httpx.stream("POST", small_chunks_server.url + "/completion", json=body, timeout=300) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    steps = [event["prompt_progress"] for event in events if "prompt_progress" in event]
    assert len(steps) >= 3, steps
    assert {step["total"] for step in steps} == {events[-1]["tokens_evaluated"]} and events[-1]["stop"] is True
    processed = [step["processed"] for step in steps]
    assert processed == sorted(processed) and processed[-1] < steps[0]["total"]
    assert all(event["content"] == "" and event["stop"] is False for event in events if "prompt_progress" in event)


def test_completion_streams_data_events_without_done(server: RunningServer) -> None:
    body = {"prompt": "Count: 1, 2, 3,", "n_predict": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(event["stop"] is False and "content" in event for event in events[:-1])
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] <= 6
    assert "".join(event["content"] for event in events[:-1])


def test_completion_takes_token_ids_and_mixed_prompts(server: RunningServer) -> None:
    def tokenize(text: str) -> list[int]:
        return httpx.post(server.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]

    ids = tokenize("The capital of France is")
    by_ids = httpx.post(server.url + "/completion", json={"prompt": ids, "n_predict": 2, "temperature": 0},
                        timeout=120).json()
    assert by_ids["tokens_evaluated"] == len(ids)
    mixed = httpx.post(server.url + "/completion", timeout=120,
                       json={"prompt": [*ids, " and the capital of Italy is"], "n_predict": 2, "temperature": 0}).json()
    assert mixed["tokens_evaluated"] == len(ids) + len(tokenize(" and the capital of Italy is"))
    outside = httpx.post(server.url + "/completion", json={"prompt": [10**9], "n_predict": 2}, timeout=60)
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "prompt.0"


def test_completion_answers_a_list_of_prompts_one_result_each(server: RunningServer) -> None:
    # llama.cpp's tools/server/tests/unit/test_completion.py test_completion_with_tokens_input, in our words.
    text = "I believe the meaning of life is"
    ids = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    body = {"prompt": [ids, text, {"prompt_string": text}], "n_predict": 4, "temperature": 0}
    answers = httpx.post(server.url + "/completion", json=body, timeout=180).json()
    assert isinstance(answers, list) and [answer["index"] for answer in answers] == [0, 1, 2], answers
    assert len({answer["content"] for answer in answers}) == 1 and answers[0]["content"]
    assert {answer["prompt"] for answer in answers} == {text}
    assert all(answer["tokens_evaluated"] == len(ids) and answer["stop"] for answer in answers)
    # One prompt given as a one-element list, or as an object, is answered as one object, as llama-server does.
    single = httpx.post(server.url + "/completion", timeout=120,
                        json={"prompt": {"prompt_string": text}, "n_predict": 4, "temperature": 0}).json()
    assert single["content"] == answers[0]["content"] and single["index"] == 0
    with httpx.stream("POST", server.url + "/completion", timeout=180,
                      json={**body, "prompt": ["Count: 1, 2, 3,", text], "stream": True}) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    for index in (0, 1):
        own = [event for event in events if event["index"] == index]
        assert own[-1]["stop"] is True and all(event["stop"] is False for event in own[:-1])
        assert 0 < len(own) - 1 <= own[-1]["tokens_predicted"] <= 4
    streamed_text = "".join(event["content"] for event in events if event["index"] == 1)
    assert streamed_text == answers[0]["content"]


def test_completion_refuses_prompts_it_cannot_read(server: RunningServer) -> None:
    def refusal(prompt: object) -> dict[str, str]:
        response = httpx.post(server.url + "/completion", json={"prompt": prompt, "n_predict": 2}, timeout=60)
        assert response.status_code == 400, response.text
        return response.json()["error"]  # type: ignore[no-any-return]

    image = refusal({"prompt_string": "Describe <__media__>", "multimodal_data": ["iVBORw0KGgo="]})
    assert "multimodal_data" in image["message"] and "text only" in image["message"]
    assert "at most 16 prompts" in refusal(["Hi"] * 17)["message"]
    assert "must not be empty" in refusal([])["message"]
    assert "prompt_string" in refusal(["Hi", {"text": "Hi"}])["message"]
    assert refusal([["Hi"], [10**9]])["param"] == "prompt.1.0"


def test_apply_template_gives_the_chat_prompt_as_text(server: RunningServer) -> None:
    messages = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]
    response = httpx.post(server.url + "/apply-template", json={"messages": messages}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": "<|im_start|>system\nYou are a test.<|im_end|>\n"
                                         "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"}
    with_tools = httpx.post(server.url + "/apply-template", timeout=60,
                            json={"messages": messages[1:], "tools": [WEATHER]}).json()["prompt"]
    assert "get_weather" in with_tools and with_tools.endswith("<|im_start|>assistant\n")
    # The text is the prompt the chat route computes: its token count is the chat answer's prompt_tokens.
    tokens = httpx.post(server.url + "/tokenize", json={"content": with_tools}, timeout=30).json()["count"]
    chat = httpx.post(server.url + CHAT, timeout=120, json={"messages": messages[1:], "tools": [WEATHER],
                                                            "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == tokens
    refused = httpx.post(server.url + "/apply-template", json={"messages": []}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"


def test_completion_follows_a_grammar(server: RunningServer) -> None:
    answer = httpx.post(server.url + "/completion", timeout=120, json={
        "prompt": "Is the sky blue? Answer:", "n_predict": 4, "grammar": 'root ::= " yes" | " no"'}).json()
    assert answer["content"] in (" yes", " no"), answer


def test_props_and_slots_answer_what_llama_servers_clients_read(server: RunningServer, model_id: str) -> None:
    props = httpx.get(server.url + "/props", timeout=60).json()
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["total_slots"] >= 1
    assert props["model_alias"] == model_id and props["model_path"].endswith(".gguf")
    assert "<|im_start|>" in props["chat_template"] and props["eos_token"] == "<|im_end|>"
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert props["build_info"].startswith("edge-llm ")
    slots = httpx.get(server.url + "/slots", timeout=60)
    assert slots.status_code == 501 and "does not support slots" in slots.json()["error"]["message"]


def detokenize(server: RunningServer, tokens: list[int]) -> str:
    return httpx.post(server.url + "/detokenize", json={"tokens": tokens}, timeout=30).json()["content"]


def test_return_tokens_gives_the_answers_token_ids(server: RunningServer) -> None:
    body = {"prompt": "The days of the week are Monday,", "n_predict": 8, "temperature": 0, "return_tokens": True}
    answer = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert len(answer["tokens"]) == answer["tokens_predicted"] > 0
    assert detokenize(server, answer["tokens"]) == answer["content"]
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True}, timeout=120) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    pieces = events[:-1]
    assert all(event["tokens"] for event in pieces) and events[-1]["tokens"] == []  # as llama-server: in the pieces
    assert detokenize(server, [token for event in pieces for token in event["tokens"]]) == "".join(
        event["content"] for event in pieces)
    infill = httpx.post(server.url + "/infill", timeout=120, json={
        "input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 6, "temperature": 0,
        "return_tokens": True}).json()
    assert infill["tokens"] and detokenize(server, infill["tokens"]) == infill["content"]
    plain = httpx.post(server.url + "/completion", json={**body, "return_tokens": False}, timeout=120).json()
    assert plain["tokens"] == []


def test_n_probs_gives_llama_servers_completion_probabilities(server: RunningServer) -> None:
    body = {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0, "n_probs": 3}
    answer = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    probabilities = answer["completion_probabilities"]
    assert len(probabilities) == answer["tokens_predicted"]
    assert "".join(entry["token"] for entry in probabilities) == answer["content"]
    for entry in probabilities:
        assert set(entry) == {"id", "token", "bytes", "logprob", "top_logprobs"} and entry["logprob"] <= 0
        assert bytes(entry["bytes"]).decode() == entry["token"] and len(entry["top_logprobs"]) == 3
        top = entry["top_logprobs"]
        assert top[0]["id"] == entry["id"]  # greedy: the chosen token is the likeliest
        assert [alternative["logprob"] for alternative in top] == sorted((a["logprob"] for a in top), reverse=True)
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True, "post_sampling_probs": True},
                      timeout=120) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    streamed = [entry for event in events[:-1] for entry in event["completion_probabilities"]]
    assert "completion_probabilities" not in events[-1] and len(streamed) == events[-1]["tokens_predicted"]
    assert all(0 < entry["prob"] <= 1 and len(entry["top_probs"]) == 3 for entry in streamed)
    assert "completion_probabilities" not in httpx.post(server.url + "/completion", timeout=120,
                                                        json={**body, "n_probs": 0}).json()


def test_tokenize_with_pieces_spells_each_token(server: RunningServer) -> None:
    text = "unicode 媽 and emoji 🤗"
    plain = httpx.post(server.url + "/tokenize", json={"content": text}, timeout=30).json()["tokens"]
    answer = httpx.post(server.url + "/tokenize", json={"content": text, "with_pieces": True}, timeout=30).json()
    assert [token["id"] for token in answer["tokens"]] == plain and answer["count"] == len(plain)
    pieces = [token["piece"] for token in answer["tokens"]]
    assert any(isinstance(piece, list) for piece in pieces)  # the emoji's bytes span tokens: no text on their own
    spelled = b"".join(piece.encode() if isinstance(piece, str) else bytes(piece) for piece in pieces)
    assert spelled.decode() == text


def test_logit_bias_in_llama_servers_forms_bans_and_forces_tokens(server: RunningServer) -> None:
    def complete(path: str, body: dict[str, object]) -> dict[str, object]:
        response = httpx.post(server.url + path, json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    body = {"prompt": "The capital of France is", "n_predict": 2, "temperature": 0, "return_tokens": True}
    first = complete("/completion", body)["tokens"][0]
    text = httpx.post(server.url + "/detokenize", json={"tokens": [first]}, timeout=60).json()["content"]
    for bias in ([[first, False]], {str(first): False}, [[text, False]], {text: -100}):
        answer = complete("/completion", {**body, "logit_bias": bias})
        assert first not in answer["tokens"], bias
    banned = complete("/completion", {**body, "logit_bias": [[first, False]]})["generation_settings"]["logit_bias"]
    assert banned == [{"bias": None, "token": first}]
    banana = httpx.post(server.url + "/tokenize", json={"content": " banana"}, timeout=60).json()["tokens"]
    pushed = complete("/completion", {**body, "logit_bias": [[" banana", 100]]})
    assert pushed["tokens"][0] in banana
    assert pushed["generation_settings"]["logit_bias"] == [{"bias": 100, "token": token} for token in banana]
    infill = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 2, "temperature": 0,
              "return_tokens": True}
    infill_first = complete("/infill", infill)["tokens"][0]
    assert infill_first not in complete("/infill", {**infill, "logit_bias": [[infill_first, False]]})["tokens"]
