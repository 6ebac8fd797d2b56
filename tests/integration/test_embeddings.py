"""/v1/embeddings on the real model: OpenAI's client and input forms, identical vectors for identical input,
computed beside streams in flight, and clear errors."""

from __future__ import annotations

import base64
import math
import struct
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from edge_llm.testing.server import RunningServer
from tests.helpers import sse_events

TEXTS = ["def add(a, b):\n    return a + b", "The quick brown fox jumps over the lazy dog."]
# ~300 tokens: several of the engine's embedding chunks
LONG_TEXT = " ".join(f"line {i}: value = compute(x_{i}, y_{i})" for i in range(30))


def embed(server: RunningServer, path: str = "/v1/embeddings", **body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=300)


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def test_the_openai_client_gets_one_normalised_vector_per_input(client: openai.OpenAI, model_id: str,
                                                                server: RunningServer) -> None:
    result = client.embeddings.create(model=model_id, input=TEXTS)  # the client asks for base64 and decodes it
    assert [item.index for item in result.data] == [0, 1]
    dimensions = {len(item.embedding) for item in result.data}
    assert dimensions == {896}  # Qwen2.5-0.5B's hidden size
    assert all(norm(item.embedding) == pytest.approx(1.0, abs=1e-4) for item in result.data)
    assert result.data[0].embedding != result.data[1].embedding
    counted = [httpx.post(server.url + "/tokenize", json={"content": text, "add_special": True}).json()["count"]
               for text in TEXTS]
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(counted)
    assert result.model == model_id


def test_the_four_input_forms_and_both_encodings_give_the_same_vector(server: RunningServer) -> None:
    text = TEXTS[0]
    tokens = httpx.post(server.url + "/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    one_string = embed(server, input=text).json()
    strings = embed(server, input=[text]).json()
    token_ids = embed(server, input=tokens).json()
    token_lists = embed(server, path="/embeddings", input=[tokens, tokens]).json()  # also without /v1
    as_base64 = embed(server, input=text, encoding_format="base64").json()
    vector = one_string["data"][0]["embedding"]
    assert strings["data"][0]["embedding"] == vector
    assert token_ids["data"][0]["embedding"] == vector
    assert [item["embedding"] for item in token_lists["data"]] == [vector, vector]
    raw = base64.b64decode(as_base64["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert list(decoded) == [struct.unpack("<f", struct.pack("<f", x))[0] for x in vector]
    assert one_string["usage"]["prompt_tokens"] == len(tokens) and token_lists["usage"]["prompt_tokens"] == 2 * len(tokens)


def test_identical_input_gives_an_identical_vector_while_streams_run_beside_it(server: RunningServer) -> None:
    """A long input (several engine chunks) alone, then again while a chat answer streams: the same vector to the
    bit, and the stream keeps receiving tokens while the embedding is computed (it is interleaved, not a stall) and
    after it (the stream goes on: the client leaves at its first chunk after the embeddings' answer)."""
    alone = embed(server, input=LONG_TEXT).json()["data"][0]["embedding"]
    assert norm(alone) == pytest.approx(1.0, abs=1e-4)

    arrivals: list[float] = []
    first_token, answered_event = threading.Event(), threading.Event()

    def stream_chat() -> None:
        body = {"messages": [{"role": "user", "content": "Count from 1 to 200, separated by spaces."}],
                "temperature": 0, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as response:
            for _, data in sse_events(response):
                if data == "[DONE]":
                    break
                arrivals.append(time.monotonic())
                first_token.set()
                if answered_event.is_set():
                    break

    streamer = threading.Thread(target=stream_chat)
    streamer.start()
    assert first_token.wait(300), "the chat stream sent nothing"
    sent = time.monotonic()
    beside = embed(server, input=[LONG_TEXT, LONG_TEXT]).json()
    answered = time.monotonic()
    answered_event.set()
    streamer.join(300)
    assert [item["embedding"] for item in beside["data"]] == [alone, alone]
    assert arrivals[-1] > answered, "the chat stream ended before the embeddings were answered"
    during = [t for t in arrivals if sent < t < answered]
    assert len(during) >= 3, f"the stream got {len(during)} chunks while the embeddings were computed"


def test_llama_servers_input_forms_read_as_their_text(server: RunningServer) -> None:
    """llama-server's forms beside OpenAI's four (llama.cpp's test_embedding): ids and text mixed, an object with
    `prompt_string` or with `content` text parts, and a list of these; media parts are the text-only 400."""
    head = httpx.post(server.url + "/tokenize", json={"content": "Hello", "add_special": True}).json()["tokens"]
    whole = embed(server, input="Hello world").json()["data"][0]["embedding"]
    parts = {"content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}
    mixed = embed(server, input=[*head, " world"])
    assert mixed.status_code == 200, mixed.text
    assert mixed.json()["data"][0]["embedding"] == whole
    several = embed(server, input=["Hello world", {"prompt_string": "Hello world"}, parts, [*head, " world"]])
    assert several.status_code == 200, several.text
    assert [item["embedding"] for item in several.json()["data"]] == [whole] * 4
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    image = embed(server, input={"content": [picture]})
    assert image.status_code == 400 and "cannot be read" in image.json()["error"]["message"]
    assert embed(server, input={"content": "Hello"}).status_code == 400


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": []}, 400, "input", None),
        ({"input": [""]}, 400, "input", None),
        ({"input": ["fine", ""]}, 400, "input.1", None),
        ({"input": [[1, 2], [151936]]}, 400, "input.1", None),
        ({"input": [-1]}, 400, "input", None),
        ({"input": "word " * 5000}, 400, "input", "context_length_exceeded"),
        ({"input": "hi", "dimensions": 256}, 400, "dimensions", None),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format", None),
        ({"input": [1.5]}, 400, "input", None),
        ({"input": "hi", "model": "text-embedding-3-small"}, 404, "model", "model_not_found"),
    ],
)
def test_bad_input_gets_a_clear_error_and_the_server_stays_up(server: RunningServer, body: dict[str, Any],
                                                              status: int, param: str, code: str | None) -> None:
    response = embed(server, **body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param or error["param"].startswith(param), error
    if code is not None:
        assert error["code"] == code
    assert embed(server, input="still up").status_code == 200
