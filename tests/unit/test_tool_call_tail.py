"""The tool-call tail (api/serving/tool_calls.py) every tool-offering family uses: calls out of whole and streamed
answers, their positions, and text passing through unchanged when no tools are offered."""

from __future__ import annotations

from edge_llm.api.serving.tool_calls import ToolCallTail, split_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_whole_answer_splits_into_text_and_calls() -> None:
    text, calls = split_calls("Checking. " + CALL + CALL, ["get_weather"])
    assert text == "Checking. "
    assert [(call.name, call.arguments) for call in calls] == [("get_weather", '{"city": "Paris"}')] * 2
    assert calls[0].id != calls[1].id


def test_without_tools_the_text_passes_through_even_when_it_spells_a_call() -> None:
    assert split_calls(CALL, ()) == (CALL, [])
    tail = ToolCallTail(())
    assert tail.feed("<tool_") == ("<tool_", []) and tail.finish() == ("", []) and tail.calls == []


def test_streamed_calls_come_whole_and_numbered_in_order() -> None:
    tail = ToolCallTail(["get_weather"])
    pieces = ["Hm", ". <tool", "_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {}}\n</tool_call>", CALL]
    text, found = "", []
    for piece in pieces:
        content, calls = tail.feed(piece)
        text += content
        found += calls
    rest, more = tail.finish()
    assert text + rest == "Hm. " and more == []
    assert [tail.index(call) for call in found] == [0, 1] and tail.calls == found


def test_a_bare_json_call_to_a_declared_function_is_held_until_the_end() -> None:
    tail = ToolCallTail(["get_weather"])
    assert tail.feed('{"name": "get_weather", "arguments": {"city": "Rome"}}') == ("", [])
    rest, calls = tail.finish()
    assert rest == "" and [call.name for call in calls] == ["get_weather"]
    assert split_calls('{"name": "other", "arguments": {}}', ["get_weather"])[1] == []
