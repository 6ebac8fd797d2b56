"""The foundation, end to end: a real server process, the real model, real HTTP."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import httpx
import openai
import pytest

from edge_llm.testing.server import RunningServer
from tests.helpers import metric, parse_sse, scrape, sse_events, wait_for
from tests.server_pool import SMALL_CHUNK

CHAT = "/v1/chat/completions"


def simple_stream(server: RunningServer, body: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, str]]]:
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=120) as response:
        raw = response.read().decode()
    return response, parse_sse(raw)


def chat(server: RunningServer, content: str, **fields: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, **fields}
    response = httpx.post(server.url + CHAT, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_simple_body_streams_plain_text_events(server: RunningServer) -> None:
    response, events = simple_stream(
        server, {"prompt": "Explain edge inference in 3 words.", "temperature": 0.7, "top_p": 0.9, "max_tokens": 32}
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    pieces = [data for name, data in events if name == "message"]
    assert len(pieces) >= 2 and "".join(pieces).strip()
    name, data = events[-1]
    assert name == "done"
    done = json.loads(data)
    assert done["finish_reason"] in ("stop", "length")
    assert done["usage"]["completion_tokens"] >= len(pieces)
    assert done["usage"]["prompt_tokens"] > 5
    # draft_n / draft_n_accepted only when speculative decoding drafted for this answer
    assert {"queue_ms", "prefill_ms", "decode_ms"} <= set(done["timings"]) <= {
        "queue_ms", "prefill_ms", "decode_ms", "draft_n", "draft_n_accepted"}


def test_simple_body_uses_documented_defaults(server: RunningServer) -> None:
    # Sampled at the default temperature, an answer may end early now and then: it never passes 128 tokens,
    # and one of three runs to exactly 128 (the default max_tokens).
    finishes = []
    for _ in range(3):
        _, events = simple_stream(server, {"prompt": "Count from 1 to 500, one number per line."})
        done = json.loads(events[-1][1])
        finishes.append((done["finish_reason"], done["usage"]["completion_tokens"]))
        assert done["usage"]["completion_tokens"] <= 128, finishes
        if done["finish_reason"] == "length":
            break
    assert finishes[-1] == ("length", 128), finishes


def test_multiline_pieces_reassemble_exactly(repeatable_server: RunningServer) -> None:
    # The same greedy answer twice, so on the server where that is guaranteed (one sequence, no prefix cache).
    body = {"prompt": "Write a Python function that adds two numbers. Only code.", "temperature": 0,
            "max_tokens": 48}
    _, events = simple_stream(repeatable_server, body)
    streamed = "".join(data for name, data in events if name == "message")
    expected = chat(repeatable_server, body["prompt"], max_tokens=48)["choices"][0]["message"]["content"]
    assert "\n" in streamed
    assert streamed == expected


def test_openai_client_streaming(client: openai.OpenAI, model_id: str) -> None:
    stream = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.model == model_id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()
    assert [c.choices[0].finish_reason for c in chunks][-1] in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_openai_client_non_streaming_with_usage(client: openai.OpenAI, model_id: str) -> None:
    completion = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}],
        max_tokens=16,
        temperature=0,
    )
    assert completion.object == "chat.completion"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and "4" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.completion_tokens <= 16


def test_temperature_zero_repeats_and_stream_equals_non_stream_alone_without_prefix_cache(
    repeatable_client: openai.OpenAI, model_id: str
) -> None:
    # Guaranteed only for a request that runs alone and is prefilled cold (docs/api/openai.md, `seed`): the prefix cache
    # and batch mates change how the prompt KV and the logits are rounded.
    client = repeatable_client
    messages = [{"role": "user", "content": "Describe a cat in two sentences."}]
    first = client.chat.completions.create(model=model_id, messages=messages, max_tokens=40, temperature=0)
    second = client.chat.completions.create(model=model_id, messages=messages, max_tokens=40, temperature=0)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model_id, messages=messages, max_tokens=40, temperature=0, stream=True
        )
    )
    assert first.choices[0].message.content == second.choices[0].message.content
    assert streamed == first.choices[0].message.content


def test_multibyte_text_streams_without_broken_characters(repeatable_client: openai.OpenAI, model_id: str) -> None:
    client = repeatable_client  # the streamed text is compared with the same request not streamed
    messages = [{"role": "user", "content": "Translate 'good morning, friend' into Japanese and Chinese, "
                                            "and add three emoji."}]
    deltas = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model_id, messages=messages, max_tokens=60, temperature=0, stream=True
        )
    ]
    text = "".join(deltas)
    assert any(ord(ch) > 0x2FFF for ch in text), text  # the answer really has multi-byte characters
    assert "\ufffd" not in text
    whole = client.chat.completions.create(model=model_id, messages=messages, max_tokens=60, temperature=0)
    assert text == whole.choices[0].message.content


def test_control_token_text_in_messages_stays_plain_text(server: RunningServer) -> None:
    plain = chat(server, "x", max_tokens=1)["usage"]["prompt_tokens"]
    imitation = chat(server, "<|im_start|>system", max_tokens=1)["usage"]["prompt_tokens"]
    # As special tokens this would be 2 tokens more than "x"-ish; as text it is several more.
    assert imitation - plain >= 5


def test_models_and_health(server: RunningServer, model_id: str) -> None:
    models = httpx.get(server.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [model_id]
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_unknown_model_is_404_not_a_substitution(server: RunningServer) -> None:
    response = httpx.post(server.url + CHAT, json={"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


LONG_PROMPT = "hello " * 9000

BAD_BODIES: list[tuple[str, Any, str | None, str | None]] = [
    ("malformed json", b'{"prompt": "hi",', None, "invalid_json"),
    ("not an object", b"[1, 2]", None, "invalid_json"),
    ("wrong type", {"prompt": "hi", "temperature": "hot"}, "temperature", None),
    ("empty prompt", {"prompt": ""}, "prompt", None),
    ("blank prompt", {"prompt": "   "}, "prompt", None),
    ("empty messages", {"messages": []}, "messages", None),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", None),
    ("max_tokens zero", {"prompt": "hi", "max_tokens": 0}, "max_tokens", None),
    ("max_tokens negative", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "max_tokens", None),
    ("temperature too high", {"prompt": "hi", "temperature": 2.5}, "temperature", None),
    ("top_p zero", {"prompt": "hi", "top_p": 0}, "top_p", None),
    ("top_p above one", {"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, "top_p", None),
    ("both prompt and messages", {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, "prompt", None),
    ("neither prompt nor messages", {"temperature": 0.5}, "messages", None),
    ("prompt beyond the context", {"prompt": LONG_PROMPT}, "messages", "context_length_exceeded"),
]


@pytest.mark.parametrize(("case", "body", "param", "code"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_input_gets_openai_error_and_server_keeps_serving(
    server: RunningServer, case: str, body: Any, param: str | None, code: str | None
) -> None:
    if isinstance(body, bytes):
        response = httpx.post(server.url + CHAT, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url + CHAT, json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert chat(server, "Say OK.", max_tokens=4)["choices"][0]["finish_reason"] in ("stop", "length")


def test_oversized_body_is_413(server: RunningServer) -> None:
    body = json.dumps({"prompt": "a" * 2_000_000}).encode()
    response = httpx.post(server.url + CHAT, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert chat(server, "Say OK.", max_tokens=4)["object"] == "chat.completion"


def test_bad_requests_leave_a_running_stream_untouched(server: RunningServer) -> None:
    body = {"prompt": "Count from 1 to 100 separated by spaces.", "temperature": 0, "max_tokens": 60}
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        seen = [next(events)]  # the first piece: the stream is decoding
        assert seen[0][0] == "message", seen
        for _, bad, _, _ in BAD_BODIES[:8]:
            payload = {"content": bad} if isinstance(bad, bytes) else {"json": bad}
            assert httpx.post(server.url + CHAT, **payload, timeout=60).status_code == 400
        seen += events
    assert seen[-1][0] == "done", seen[-3:]
    done = json.loads(seen[-1][1])
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 60


def test_max_tokens_beyond_the_context_is_capped(serial_server: RunningServer) -> None:
    numbers = ", ".join(str(n) for n in range(1, 70))
    body = {"messages": [{"role": "user", "content": f"Repeat this list exactly, twice: {numbers}"}],
            "temperature": 0, "max_tokens": 100_000}
    response = httpx.post(serial_server.url + CHAT, json=body, timeout=300)
    assert response.status_code == 200, response.text
    completion = response.json()
    usage = completion["usage"]
    assert completion["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512


HOLDER = {"prompt": "Count from 1 to 10000, one number per line.", "temperature": 0, "max_tokens": 3000}


def queue_filled_then_refused(server: RunningServer, path: str, body: dict[str, Any],
                              refused: int) -> tuple[httpx.Response, list[httpx.Response]]:
    """With one sequence and one waiting slot: a long stream runs (its first token has arrived) and `body` waits
    (the queue-depth gauge says 1), so `refused` more copies of `body` find the queue full, whatever the machine's
    speed; then the long stream's client leaves and the waiting `body` runs. Returns its answer and the refusals."""
    with httpx.stream("POST", server.url + "/completion", json={**HOLDER, "stream": True}, timeout=300) as holder:
        assert holder.status_code == 200
        events = sse_events(holder)
        next(events)  # the holder is running
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, server.url + path, json=body, timeout=300)
            wait_for(lambda: metric(scrape(server), "edge_llm_queue_depth") == 1, 120, "the request to wait")
            refusals = [httpx.post(server.url + path, json=body, timeout=300) for _ in range(refused)]
            holder.close()  # the client leaves: its sequence is freed and the waiting request runs
            return waiting.result(300), refusals


def test_queue_full_gets_503_and_every_accepted_request_completes(serial_server: RunningServer) -> None:
    body = {"messages": [{"role": "user", "content": "Write a short poem about rivers."}],
            "temperature": 0, "max_tokens": 24}
    accepted, rejected = queue_filled_then_refused(serial_server, CHAT, body, 3)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["usage"]["completion_tokens"] > 0
    assert accepted.json()["choices"][0]["finish_reason"] in ("stop", "length")
    for response in rejected:
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["code"] == "queue_full"


def test_queue_full_on_ollamas_chat_is_503_in_ollamas_envelope(serial_server: RunningServer) -> None:
    body = {"model": "qwen2.5-coder:0.5b", "stream": False, "options": {"temperature": 0, "num_predict": 24},
            "messages": [{"role": "user", "content": "Write a short poem about rivers."}]}
    accepted, rejected = queue_filled_then_refused(serial_server, "/api/chat", body, 3)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["done"] is True and accepted.json()["eval_count"] > 0
    for response in rejected:
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) >= 1
        assert set(response.json()) == {"error"} and response.json()["error"]


def _open_stream_and_leave(url: str, body: dict[str, Any], events_before_leaving: int) -> None:
    with httpx.stream("POST", url + CHAT, json=body, timeout=120) as response:
        assert response.status_code == 200
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data:"):
                seen += 1
                if seen >= events_before_leaving:
                    return


def test_disconnect_mid_stream_frees_the_engine(serial_server: RunningServer) -> None:
    long_body = {"prompt": "Count from 1 to 10000, one number per line.", "temperature": 0, "max_tokens": 450}
    _open_stream_and_leave(serial_server.url, long_body, 2)
    # With one sequence slot, this request could only start after 450 tokens unless the first was cancelled.
    done = json.loads(simple_stream(serial_server, {"prompt": "Say hi.", "max_tokens": 4})[1][-1][1])
    assert done["timings"]["queue_ms"] < 5000, done


def test_disconnect_while_queued_is_dropped(serial_server: RunningServer) -> None:
    def queued_cancellations() -> float:
        return metric(scrape(serial_server), "edge_llm_cancellations_total", phase="queued")

    before = queued_cancellations()
    long_body = {"prompt": "Count from 1 to 10000, one number per line.", "temperature": 0, "max_tokens": 400}
    with httpx.stream("POST", serial_server.url + CHAT, json=long_body, timeout=120) as running:
        assert running.status_code == 200
        events = sse_events(running)  # kept: a dropped event iterator closes the stream at once
        assert next(events)[0] == "message"  # it holds the only sequence
        # This one waits in the queue behind the running one; the client gives up before it starts.
        queued_body = {"messages": [{"role": "user", "content": "Count to 10000."}], "max_tokens": 400}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(serial_server.url + CHAT, json=queued_body, timeout=0.5)
        wait_for(lambda: queued_cancellations() > before, 30, "the engine to drop the abandoned queued request")
    # Leaving the running stream cancels it as well: nothing is ahead of the next request.
    done = json.loads(simple_stream(serial_server, {"prompt": "Say hi.", "max_tokens": 4})[1][-1][1])
    assert done["timings"]["queue_ms"] < 5000, done


def test_a_long_prompt_shows_its_prefill_moving_in_comment_lines(small_chunks_server: RunningServer,
                                                                  model_id: str) -> None:
    # ~350 tokens never seen before: several prefill chunks of at most --batch-size (64) tokens.
    server = small_chunks_server
    text = " ".join(f"Entry {i}: the value of register {i * 37 % 101} is {i * 59 % 997}." for i in range(24))
    body = {"model": model_id, "messages": [{"role": "user", "content": text + "\nWhich entry mentions 420?"}],
            "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    notes: list[tuple[int, int]] = []
    first_data_after_notes = None
    usage = None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith(": prefill "):
                done, total = line.removeprefix(": prefill ").split(" tokens")[0].split("/")
                notes.append((int(done), int(total)))
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if first_data_after_notes is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first_data_after_notes = len(notes)
                usage = chunk.get("usage") or usage
    assert usage is not None and usage["prompt_tokens"] > 4 * SMALL_CHUNK
    assert len(notes) >= 3, notes
    assert {total for _, total in notes} == {usage["prompt_tokens"]}
    done = [d for d, _ in notes]
    assert done == sorted(done) and len(set(done)) == len(done) and done[-1] < usage["prompt_tokens"]
    assert first_data_after_notes == len(notes)  # every note came before the answer's first text
