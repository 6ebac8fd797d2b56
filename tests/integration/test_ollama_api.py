"""Ollama's generation API (/api/chat, /api/generate, /api/embed, /api/embeddings) with the official `ollama` Python
package, and on the wire as its clients send it (bodies captured from ollama-python 0.6.3: `stream` always given,
`tools: []` on every chat, options only as set). The JavaScript package and LangChain: test_ollama_clients.py."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest

from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.testing.server import MODEL, RunningServer, require_model, run_server
from tests.helpers import metric, scrape, small_model, wait_for

pytestmark = pytest.mark.integration

TIMEOUT = 300
CREATED_AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
FIGURES = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration")
COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by spaces."}]


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The name of the city

    Returns:
      str: The weather
    """
    return "sunny, 21 C"


@pytest.fixture(scope="module")
def client(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=TIMEOUT)


def post(server: RunningServer, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=TIMEOUT)


def lines(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in response.text.splitlines()]


def assert_final(answer: Any, model: str) -> None:
    """The last (or only) object of an answer: done, why, and Ollama's figures in nanoseconds."""
    assert answer.model == model and CREATED_AT.match(answer.created_at), answer
    assert answer.done is True and answer.done_reason in ("stop", "length"), answer
    assert answer.prompt_eval_count > 0 and answer.eval_count > 0, answer
    assert answer.total_duration >= answer.prompt_eval_duration + answer.eval_duration > 0, answer
    assert answer.load_duration >= 0, answer


# ---- chat and generate ---------------------------------------------------------------------------------------


def test_chat_answers_whole_and_streamed_with_ollamas_figures(client: ollama.Client, model_id: str) -> None:
    whole = client.chat(model=model_id, messages=COUNT, options={"temperature": 0, "num_predict": 8})
    assert whole.message.role == "assistant" and whole.message.content.strip(), whole
    assert_final(whole, model_id)
    assert whole.eval_count <= 8

    parts = list(client.chat(model=model_id, messages=COUNT, stream=True, options={"num_predict": 8}))
    *pieces, last = parts
    assert pieces and all(part.done is False and part.message.role == "assistant" for part in pieces)
    assert "".join(part.message.content for part in pieces).strip()
    assert last.message.content == ""
    assert_final(last, model_id)


def test_the_default_is_an_ndjson_stream_of_ollamas_objects(server: RunningServer, model_id: str) -> None:
    response = post(server, "/api/generate", {"model": model_id, "prompt": "Why is the sky blue?",
                                              "options": {"num_predict": 6}})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    *pieces, last = lines(response)
    assert pieces and all(set(piece) == {"model", "created_at", "response", "done"} for piece in pieces), pieces
    assert set(last) == {"model", "created_at", "response", "done", "done_reason", "context", *FIGURES}, last
    assert last["response"] == "" and last["eval_count"] == 6 and last["done_reason"] == "length"
    # `context` is the prompt and the answer as tokens: sent back, they come before the next prompt.
    text = "".join(piece["response"] for piece in pieces)
    following = post(server, "/api/generate", {"model": model_id, "prompt": "Say it again.", "context": last["context"],
                                               "stream": False, "options": {"num_predict": 2}}).json()
    assert following["prompt_eval_count"] > len(last["context"])
    assert following["context"][:len(last["context"])] == last["context"]
    detokenized = post(server, "/detokenize", {"tokens": following["context"]}).json()["content"]
    assert text in detokenized and "Why is the sky blue?" in detokenized and "Say it again." in detokenized


def test_generate_with_a_suffix_fills_the_middle_with_the_models_fim_tokens(client: ollama.Client,
                                                                             server: RunningServer,
                                                                             model_id: str) -> None:
    answer = client.generate(model=model_id, prompt="def area(radius):\n    ", suffix="\n    return result\n",
                             options={"temperature": 0, "num_predict": 24})
    assert answer.response and answer.done, answer
    context = list(answer.context)  # the prompt's layout: ... <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>
    marks = [post(server, "/tokenize", {"content": mark}).json()["tokens"]
             for mark in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")]
    assert all(len(mark) == 1 for mark in marks), marks
    prefix, suffix, middle = (context.index(mark[0]) for mark in marks)
    text = [post(server, "/detokenize", {"tokens": context[start + 1:end]}).json()["content"]
            for start, end in ((prefix, suffix), (suffix, middle))]
    assert text == ["def area(radius):\n", "\n    return result\n"], text


def test_raw_generate_takes_the_prompt_as_the_model_reads_it(server: RunningServer, model_id: str) -> None:
    prompt = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"
    answer = post(server, "/api/generate", {"model": model_id, "prompt": prompt, "raw": True, "stream": False,
                                            "options": {"temperature": 0, "num_predict": 4}}).json()
    tokenized = post(server, "/tokenize", {"content": prompt, "add_special": True}).json()["tokens"]
    assert answer["prompt_eval_count"] == len(tokenized) and "context" not in answer, answer
    refused = post(server, "/api/generate", {"model": model_id, "prompt": prompt, "raw": True, "system": "Be brief."})
    assert refused.status_code == 400
    assert refused.json() == {"error": "raw mode does not support template, system, or context"}


def test_options_cap_stop_and_seed_the_answer(client: ollama.Client, model_id: str) -> None:
    capped = client.chat(model=model_id, messages=COUNT, options={"temperature": 0, "num_predict": 3})
    assert capped.eval_count == 3 and capped.done_reason == "length", capped
    stopped = client.generate(model=model_id, prompt="Count from 1 to 20, separated by spaces.",
                              options={"temperature": 0, "stop": ["5"], "num_predict": 60})
    assert stopped.done_reason == "stop" and "4" in stopped.response and "5" not in stopped.response, stopped
    windowed = client.chat(model=model_id, messages=COUNT, options={"num_ctx": 64})
    assert windowed.prompt_eval_count + windowed.eval_count <= 64, windowed
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=model_id, messages=COUNT, options={"num_ctx": 8})
    assert refused.value.status_code == 400 and "num_ctx 8" in refused.value.error


def test_a_seed_repeats_a_sampled_answer(repeatable_server: RunningServer, model_id: str) -> None:
    client = ollama.Client(host=repeatable_server.url, timeout=TIMEOUT)
    options = {"seed": 1234, "temperature": 1.2, "top_k": 100, "top_p": 1.0, "num_predict": 24}
    first, second = (client.generate(model=model_id, prompt="Invent a word.", options=options) for _ in range(2))
    assert first.response == second.response and first.eval_count == second.eval_count


def test_options_this_server_does_not_use_are_named_in_the_header(server: RunningServer, model_id: str) -> None:
    response = post(server, "/api/chat", {"model": model_id, "messages": COUNT, "stream": False, "truncate": True,
                                          "options": {"temperature": 0, "num_predict": 2, "mirostat": 2,
                                                      "num_gpu": 99, "repeat_last_n": 64, "nonsense": 1}})
    assert response.status_code == 200, response.text
    ignored = response.headers["x-edge-llm-ignored-fields"].split(",")
    assert sorted(ignored) == ["options.mirostat", "options.nonsense", "options.num_gpu", "truncate"]


def test_tools_round_trip_with_arguments_as_objects(client: ollama.Client, server: RunningServer,
                                                    model_id: str) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    called = client.chat(model=model_id, messages=ask, tools=[get_weather],
                         options={"temperature": 0, "num_predict": 60})
    calls = called.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", called.message
    assert isinstance(calls[0].function.arguments, dict) and "city" in calls[0].function.arguments
    assert called.message.content == ""
    # The call and its result go back, as Ollama's clients send them (arguments as an object, tool_name).
    history = [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": dict(calls[0].function.arguments)}}]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
    answered = client.chat(model=model_id, messages=history, tools=[get_weather],
                           options={"temperature": 0, "num_predict": 1})
    # The same conversation through the OpenAI route renders the same prompt.
    openai_history = [*ask, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps(dict(calls[0].function.arguments))}}]},
        {"role": "tool", "content": "sunny, 21 C", "tool_call_id": "call_1"}]
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "required": ["city"],
                       "properties": {"city": {"type": "string", "description": "The name of the city"}}}}}]
    usage = post(server, "/v1/chat/completions", {"model": model_id, "messages": openai_history, "tools": tools,
                                                  "max_tokens": 1}).json()["usage"]
    assert answered.prompt_eval_count == usage["prompt_tokens"]


def test_a_streamed_tool_call_is_one_object_with_the_whole_call(client: ollama.Client, model_id: str) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    parts = list(client.chat(model=model_id, messages=ask, tools=[get_weather], stream=True,
                             options={"temperature": 0, "num_predict": 60}))
    calls = [call for part in parts for call in part.message.tool_calls or []]
    assert [call.function.name for call in calls] == ["get_weather"], parts
    assert "city" in calls[0].function.arguments and parts[-1].done


def test_format_makes_the_answer_follow_a_schema_or_be_json(client: ollama.Client, model_id: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    answer = client.chat(model=model_id, messages=[{"role": "user", "content": "A pet named Rex, aged 3."}],
                         format=schema, options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(answer.message.content), schema)
    generated = client.generate(model=model_id, prompt="Describe a cat in JSON.", format="json",
                                options={"temperature": 0, "num_predict": 80})
    if generated.done_reason == "stop":
        assert isinstance(json.loads(generated.response), dict)
    else:
        assert generated.response.lstrip().startswith("{"), generated.response
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=model_id, messages=COUNT, format={"type": "bogus"})
    assert refused.value.status_code == 400


# ---- embeddings ---------------------------------------------------------------------------------------------------


def test_embed_gives_one_normalised_vector_per_input_and_truncates(client: ollama.Client, model_id: str) -> None:
    answer = client.embed(model=model_id, input=["The sky is blue.", "Grass is green."])
    assert answer.model == model_id and len(answer.embeddings) == 2 and answer.prompt_eval_count > 0
    assert all(math.isclose(math.hypot(*vector), 1.0, rel_tol=1e-3) for vector in answer.embeddings)
    one = client.embeddings(model=model_id, prompt="The sky is blue.").embedding
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(one, answer.embeddings[0], strict=True))
    long = "word " * 40
    cut = client.embed(model=model_id, input=long, options={"num_ctx": 8})
    assert cut.prompt_eval_count == 8
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=model_id, input=long, truncate=False, options={"num_ctx": 8})
    assert refused.value.status_code == 400
    assert client.embed(model=model_id, input="").embeddings == []  # loads the model, embeds nothing
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=model_id, input="hi", dimensions=3)
    assert refused.value.status_code == 400 and "dimensions" in refused.value.error


# ---- errors and cancellation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"])
def test_an_unknown_model_is_ollamas_404(server: RunningServer, path: str) -> None:
    response = post(server, path, {"model": "no-such-model:7b", "messages": COUNT, "prompt": "hi", "input": "hi"})
    assert response.status_code == 404
    assert response.json() == {"error": "model 'no-such-model:7b' not found"}


def test_requests_a_text_model_cannot_serve_are_refused_in_ollamas_envelope(client: ollama.Client,
                                                                            server: RunningServer,
                                                                            model_id: str) -> None:
    pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=model_id, messages=[{"role": "user", "content": "What is this?", "images": [pixel]}])
    assert refused.value.status_code == 400 and "vision" in refused.value.error
    assert "messages.0.images" in refused.value.error
    for body in ({"messages": COUNT, "think": True}, {"prompt": "hi", "think": "high"}):
        path = "/api/chat" if "messages" in body else "/api/generate"
        response = post(server, path, {"model": model_id, **body})
        assert response.status_code == 400 and response.json() == {"error": f'"{model_id}" does not support thinking'}
    answer = post(server, "/api/chat", {"model": model_id, "messages": COUNT, "think": False, "stream": False,
                                        "options": {"num_predict": 2}})
    assert answer.status_code == 200 and "thinking" not in answer.json()["message"]
    for body in ({"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]}, {"format": "yaml"}):
        response = post(server, "/api/chat", {"model": model_id, "messages": COUNT, **body})
        assert response.status_code == 400 and set(response.json()) == {"error"}, response.text


def test_a_client_that_leaves_a_stream_cancels_the_generation(server: RunningServer, model_id: str) -> None:
    def cancelled() -> float:
        return sum(metric(scrape(server), "edge_llm_cancellations_total", phase=phase)
                   for phase in ("queued", "prefill", "decode"))

    before = cancelled()
    with httpx.stream("POST", server.url + "/api/generate", timeout=TIMEOUT,
                      json={"model": model_id, "prompt": "Write the numbers from 1 to 3000.",
                            "options": {"num_predict": 2000}}) as response:
        first = json.loads(next(response.iter_lines()))
        assert first["done"] is False
    wait_for(lambda: cancelled() == before + 1 and metric(scrape(server), "edge_llm_running_sequences") == 0,
             TIMEOUT, "the generation to be cancelled")


# ---- a server with two models, on demand, behind an API key ------------------------------------------------------

KEY = "sk-ollama"
BEARER = {"Authorization": f"Bearer {KEY}"}
GEMMA_ID = GEMMA_3_270M.filename.removesuffix(".gguf")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("ollama-models")
    (directory / MODEL.name).symlink_to(require_model())
    (directory / GEMMA_3_270M.filename).symlink_to(small_model())
    with run_server(Path(tmp_path_factory.mktemp("ollama")), "--models-dir", str(directory), "--api-key", KEY,
                    "--ctx-size", "2048", "--parallel", "2", model=None) as running:
        yield running


def states(server: RunningServer) -> dict[str, str]:
    return httpx.get(server.url + "/readyz", timeout=30).json()["models"]


def test_keep_alive_zero_unloads_and_an_empty_request_loads_or_unloads(two_models: RunningServer,
                                                                       model_id: str) -> None:
    client = ollama.Client(host=two_models.url, headers=BEARER, timeout=TIMEOUT)
    loaded = client.generate(model=model_id)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert states(two_models)[model_id] == "loaded"
    unloaded = client.chat(model=model_id, messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.message.content == ""
    assert states(two_models)[model_id] == "unloaded"
    samples = scrape(two_models, BEARER)
    assert metric(samples, "edge_llm_model_unloads_total", model=model_id, reason="request") == 1
    assert metric(samples, "edge_llm_model_loads_total", model=model_id) == 1

    answer = client.chat(model=model_id, messages=COUNT, keep_alive=0, options={"num_predict": 2})
    assert answer.load_duration > 0 and answer.total_duration > answer.load_duration  # it waited for the load
    wait_for(lambda: states(two_models)[model_id] == "unloaded", TIMEOUT, "keep_alive 0 to unload the model")
    assert metric(scrape(two_models, BEARER), "edge_llm_model_unloads_total", model=model_id, reason="keep_alive") == 1


def test_a_model_without_fim_tokens_refuses_a_suffix_as_ollama_does(two_models: RunningServer) -> None:
    response = post(two_models, "/api/generate", {"model": GEMMA_ID, "prompt": "def f(", "suffix": ")"}, **BEARER)
    assert response.status_code == 400 and response.json() == {"error": f"{GEMMA_ID} does not support insert"}


def test_the_api_key_applies_and_its_refusal_wears_ollamas_envelope(two_models: RunningServer) -> None:
    refused = post(two_models, "/api/chat", {"model": GEMMA_ID, "messages": COUNT})
    assert refused.status_code == 401 and set(refused.json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as raised:
        ollama.Client(host=two_models.url, headers={"Authorization": "Bearer wrong"}).generate(model=GEMMA_ID)
    assert raised.value.status_code == 401
    answer = ollama.Client(host=two_models.url, headers=BEARER, timeout=TIMEOUT).generate(
        model=GEMMA_ID, prompt="Hello", options={"num_predict": 2})
    assert answer.model == GEMMA_ID and answer.done


def test_logprobs_come_one_a_token_with_the_top_alternatives(server: RunningServer, model_id: str) -> None:
    body = {"model": model_id, "prompt": "Count from 1 to 9.", "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 6}}
    answer = post(server, "/api/generate", {**body, "stream": False}).json()
    entries = answer["logprobs"]
    assert len(entries) == answer["eval_count"] and "".join(entry["token"] for entry in entries) == answer["response"]
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["logprob"] >= entry["logprob"]
    streamed = lines(post(server, "/api/chat", {**body, "messages": COUNT}))
    assert sum(len(line.get("logprobs", [])) for line in streamed) == streamed[-1]["eval_count"]
    assert "logprobs" not in post(server, "/api/generate", {**body, "logprobs": False, "stream": False}).json()
