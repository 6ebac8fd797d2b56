"""edge-llm chat's pure parts: commands, request bodies, SSE framing, figures."""

from __future__ import annotations

from edge_llm.cli.chat import Answer, Conversation, _sse_data, command


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


def test_sse_data_joins_multi_line_events() -> None:
    lines = ["data: {\"a\": 1}", "", ": comment", "data: one", "data: two", "", "data: [DONE]", ""]
    assert list(_sse_data(iter(lines))) == ['{"a": 1}', "one\ntwo", "[DONE]"]


def test_figures() -> None:
    answer = Answer(started=10.0, first_at=10.5, ended=12.5, completion_tokens=41)
    assert answer.figures() == "TTFT 0.50 s · 20.0 tok/s · 41 tokens"
    answer.stopped = True
    assert answer.figures().endswith("stopped")
    assert Answer(completion_tokens=1).figures() == "1 token"
