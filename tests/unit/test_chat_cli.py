"""edge-llm chat's parts without a server: commands, request bodies, reading a stream (httpx-sse), figures."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import httpx
import pytest

from edge_llm.cli.chat import Answer, ChatClient, ChatError, Conversation, command


def test_commands_change_the_conversation() -> None:
    conversation = Conversation()
    conversation.messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert command(conversation, "/system Be brief.") == "(system prompt set: Be brief.)"
    assert conversation.body()["messages"][0] == {"role": "system", "content": "Be brief."}
    assert command(conversation, "/set temperature 0.2") == "(temperature = 0.2)"
    assert command(conversation, "/set top-p 0.5") == "(top_p = 0.5)"
    assert command(conversation, "/set max_tokens 64") == "(max_tokens = 64)"
    assert "needs a number" in command(conversation, "/set max_tokens lots")
    assert "unknown setting" in command(conversation, "/set colour blue")
    assert command(conversation, "/set") == "temperature=0.2  top_p=0.5  max_tokens=64"
    body = conversation.body()
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.5, 64)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert command(conversation, "/set top_p default") == "(top_p back to the server's default)"
    assert "top_p" not in conversation.body()
    assert command(conversation, "/reset") == "(conversation cleared)"
    assert conversation.body()["messages"] == [{"role": "system", "content": "Be brief."}]
    assert command(conversation, "/system") == "(system prompt cleared)"
    assert conversation.body()["messages"] == []
    assert "unknown command" in command(conversation, "/frobnicate")
    assert "/reset" in command(conversation, "/help")


@pytest.fixture
def client_answering(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ChatClient]:
    """client_answering(*chunks): a ChatClient whose server sends `chunks` (split anywhere, as a network may); the
    client's own httpx.Client (its headers and timeouts) over a mock transport."""
    real_client = httpx.Client

    def answering(*chunks: bytes, content_type: str = "text/event-stream") -> ChatClient:
        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, headers={"content-type": content_type}, content=iter(chunks))

        monkeypatch.setattr(httpx, "Client",
                            lambda **options: real_client(transport=httpx.MockTransport(handler), **options))
        return ChatClient("http://chat.test", None)

    return answering


def delta(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def test_the_stream_is_read_event_by_event_and_comments_are_ignored(
        client_answering: Callable[..., ChatClient]) -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                      "prompt_tokens_details": {"cached_tokens": 1}}}
    stream = (f": keep-alive\n\n{delta('Hel')}\n\n: keep-alive\n\n{delta('lo')}\n\n"
              f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n").encode()
    answer, out = Answer(), io.StringIO()
    client_answering(stream[:7], stream[7:40], stream[40:]).stream({}, answer, out)
    assert out.getvalue() == answer.text == "Hello"
    assert (answer.completion_tokens, answer.prompt_tokens, answer.cached_tokens) == (2, 3, 1)
    assert answer.ended is not None


def test_an_error_event_and_a_reply_that_is_not_a_stream_are_chat_errors(
        client_answering: Callable[..., ChatClient]) -> None:
    error = b'data: {"error": {"message": "the engine stopped"}}\n\n'
    with pytest.raises(ChatError, match="the engine stopped"):
        client_answering(error).stream({}, Answer(), io.StringIO())
    with pytest.raises(ChatError, match="did not answer with an event stream"):
        client_answering(b"{}", content_type="application/json").stream({}, Answer(), io.StringIO())


def test_figures() -> None:
    answer = Answer(started=10.0, first_at=10.5, ended=12.5, completion_tokens=41)
    assert answer.figures() == "TTFT 0.50 s · 20.0 tok/s · 41 tokens"
    answer.stopped = True
    assert answer.figures().endswith("stopped")
    assert Answer(completion_tokens=1).figures() == "1 token"
