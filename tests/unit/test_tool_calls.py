"""The tool-call parser (prompting/tools.py): tagged calls, and bare JSON calls to declared functions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge_llm.prompting.tools import ToolCallParser


def run(parser: ToolCallParser, parts: list[str]) -> tuple[str, list[tuple[str, str]]]:
    text = []
    for part in parts:
        content, _ = parser.feed(part)
        text.append(content)
    content, _ = parser.finish()
    text.append(content)
    return "".join(text), [(call.name, call.arguments) for call in parser.calls]


def test_a_bare_object_naming_a_declared_function_is_a_call_however_it_is_split() -> None:
    answer = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    for cut in range(len(answer)):
        parser = ToolCallParser(["get_weather"])
        assert run(parser, [answer[:cut], answer[cut:]]) == ("", [("get_weather", '{"city": "Paris"}')])


def test_one_call_per_line_and_a_fenced_call() -> None:
    lines = '{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"x": 1}}\n'
    assert run(ToolCallParser(["a", "b"]), [lines]) == ("", [("a", "{}"), ("b", '{"x": 1}')])
    fenced = '```json\n{"name": "a", "arguments": {"k": "v"}}\n```'
    assert run(ToolCallParser(["a"]), [fenced]) == ("", [("a", '{"k": "v"}')])


def test_anything_else_stays_text() -> None:
    for answer in ('{"name": "unknown", "arguments": {}}', '{"name": "a", "arguments": "x"}', '{"a": 1}',
                   '{"name": "a", "arguments": {}} and more', "Sure: {\"name\": \"a\", \"arguments\": {}}", "{"):
        assert run(ToolCallParser(["a"]), [answer]) == (answer, []), answer


def test_without_declared_functions_only_tagged_calls_count() -> None:
    assert run(ToolCallParser(), ['{"name": "a", "arguments": {}}']) == ('{"name": "a", "arguments": {}}', [])
    tagged = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'
    assert run(ToolCallParser(), [tagged]) == ("", [("a", "{}")])


@given(st.text(max_size=60), st.lists(st.integers(0, 60), max_size=4))
def test_text_that_is_no_call_comes_back_whole(text: str, cuts: list[int]) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    parts = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    content, calls = run(ToolCallParser(["f"]), parts)
    if not calls:
        assert content == text
