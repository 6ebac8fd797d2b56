"""What the models here cannot read, and prompts longer than the context, on the OpenAI and Anthropic routes: a clear
400 in the protocol's own envelope (never a 500 or a hang), and OpenAI's `developer` role read as `system`."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from edge_llm.testing.server import RunningServer

LONG = "hello " * 9000  # beyond a sequence's context on the session server
TEXT_ONLY = "this model reads text only"

CHAT_PARTS = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
]
RESPONSES_PARTS = [
    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
    {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
]


@pytest.mark.parametrize("part", CHAT_PARTS, ids=[part["type"] for part in CHAT_PARTS])
def test_chat_media_parts_are_a_400_that_says_why(client: openai.OpenAI, model_id: str, part: dict[str, Any]
                                                  ) -> None:
    # The shapes openai-python's ChatCompletionContentPart*Param types describe.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_id, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}])  # type: ignore[list-item]
    assert TEXT_ONLY in caught.value.message and f"'{part['type']}'" in caught.value.message
    assert caught.value.body["param"] == "messages.0.content.1" and caught.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("part", RESPONSES_PARTS, ids=[part["type"] for part in RESPONSES_PARTS])
def test_responses_media_parts_are_a_400_that_says_why(client: openai.OpenAI, model_id: str, part: dict[str, Any]
                                                       ) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=model_id, max_output_tokens=2, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, part]}])  # type: ignore
    assert TEXT_ONLY in caught.value.message and caught.value.body["param"] == "input.0.content.1.type"


def test_developer_is_read_as_system(client: openai.OpenAI, model_id: str) -> None:
    def prompt_tokens(role: str) -> int:
        answer = client.chat.completions.create(model=model_id, max_tokens=1, messages=[
            {"role": role, "content": "Answer in French."}, {"role": "user", "content": "Hi"}])  # type: ignore
        assert answer.usage is not None
        return answer.usage.prompt_tokens

    assert prompt_tokens("developer") == prompt_tokens("system")
    as_item = client.responses.create(model=model_id, max_output_tokens=1, input=[
        {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}])
    as_instructions = client.responses.create(model=model_id, max_output_tokens=1, instructions="Answer in French.",
                                              input="Hi")
    assert as_item.usage.input_tokens == as_instructions.usage.input_tokens == prompt_tokens("system")


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_openais_context_length_exceeded(client: openai.OpenAI, model_id: str,
                                                                       stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=model_id, max_tokens=4, stream=stream,
                                       messages=[{"role": "user", "content": LONG}])
    assert chat.value.body["code"] == "context_length_exceeded" and chat.value.body["param"] == "messages"
    assert "maximum context length" in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=model_id, max_output_tokens=4, stream=stream, input=LONG)
    assert responses.value.body["code"] == "context_length_exceeded" and responses.value.body["param"] == "input"
    # Far over: refused by its size before it is tokenized, with the same error.
    with pytest.raises(openai.BadRequestError) as huge:
        client.responses.create(model=model_id, max_output_tokens=4, stream=stream, input="hello " * 150_000)
    assert huge.value.body["code"] == "context_length_exceeded" and huge.value.body["param"] == "input"


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_anthropics_invalid_request_error(server: RunningServer, model_id: str,
                                                                        stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=model_id, max_tokens=4, stream=stream,
                               messages=[{"role": "user", "content": LONG}])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in caught.value.body["error"]["message"]
