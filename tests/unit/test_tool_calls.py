"""The tool-call parser (prompting/tools.py): tagged calls, and bare JSON calls to declared functions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge_llm.prompting.tools import ToolCallParser, forced_call_grammar


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


def splits(text: str) -> list[list[str]]:
    """The text whole, cut once at every position, and one character at a time (how a stream can deliver it)."""
    return [[text]] + [[text[:cut], text[cut:]] for cut in range(1, len(text))] + [list(text)]


def test_tagged_calls_between_text_come_out_the_same_however_the_stream_is_cut() -> None:
    answer = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> and '
              '<tool_call>{"name": "now", "parameters": {"tz": "UTC"}}</tool_call><tool_call>{"name": "x"}</tool_call>!')
    for parts in splits(answer):
        assert run(ToolCallParser(), parts) == ("Let me check.  and !", [
            ("get_weather", '{"city": "Paris"}'), ("now", '{"tz": "UTC"}'), ("x", "{}")]), parts


def test_a_tagged_call_is_handed_out_as_soon_as_it_closes() -> None:
    parser = ToolCallParser()
    assert parser.feed("Hi <tool_") == ("Hi ", [])  # a tag's start is held back until it is known
    assert parser.feed('call>{"name": "a", "arguments": {"k": "é"}}') == ("", [])
    content, calls = parser.feed("</tool_call> bye")
    assert content == " bye" and [(c.name, c.arguments) for c in calls] == [("a", '{"k": "é"}')]
    assert parser.feed("<tool") == ("", []) and parser.finish() == ("<tool", [])  # never a tag: it was text


def test_what_is_no_call_inside_tags_goes_through_as_text() -> None:
    for body in ("not json", '["name", "a"]', '{"name": 3}', '{"arguments": {}}'):
        answer = f"<tool_call>{body}</tool_call>"
        for parts in splits(answer):
            assert run(ToolCallParser(), parts) == (answer, []), parts


def test_an_unclosed_tag_is_a_call_if_its_body_parses_and_text_if_not() -> None:
    assert run(ToolCallParser(), ['x <tool_call>\n {"name": "a", "arguments": "{}"} \n']) == ("x ", [("a", "{}")])
    assert run(ToolCallParser(), ["x <tool_call>{\"name\": "]) == ("x <tool_call>{\"name\": ", [])
    assert run(ToolCallParser(["a"]), ['{"name": "a", "arguments": {}} <tool_call>{"name": "b"}']) == (
        '{"name": "a", "arguments": {}} ', [("b", "{}")])


def test_plain_text_with_declared_functions_streams_at_once() -> None:
    parser = ToolCallParser(["a"])
    assert parser.feed("  ") == ("", [])  # blank so far: not known yet
    assert parser.feed(" Hello") == ("   Hello", [])
    assert parser.feed(" there") == (" there", [])
    held = ToolCallParser(["a"])
    assert held.feed(" {") == ("", []) and held.feed('"x": 1}') == ("", [])  # an object: held until the end
    assert held.finish() == (' {"x": 1}', [])


def test_bare_calls_in_a_fence_of_any_language_or_with_blank_lines() -> None:
    for answer in ('```\n{"name": "a", "arguments": {}}\n```', '```JSON\n{"name": "a", "arguments": {}}```',
                   '\n{"name": "a", "arguments": {}}\n\n{"name": "a", "arguments": {}}\n',
                   '```json\n{"name": "a", "arguments": {}}\n{"name": "a", "arguments": {}}\n```'):
        content, calls = run(ToolCallParser(["a"]), [answer])
        assert content == "" and calls and all(call == ("a", "{}") for call in calls), answer
    assert run(ToolCallParser(["a"]), ['{"name": "a", "arguments": {"city": "Zürich"}}']) == (
        "", [("a", '{"city": "Zürich"}')])  # the arguments' text as the model wrote it, not \\u-escaped
    mixed = '{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}'
    assert run(ToolCallParser(["a"]), [mixed]) == (mixed, [])  # one undeclared: none is a call


def test_each_call_has_its_own_openai_id_and_shape() -> None:
    parser = ToolCallParser(["a"])
    run(parser, ['{"name": "a", "arguments": {"n": 1}}\n{"name": "a", "arguments": {}}'])
    first, second = parser.calls
    assert first.id != second.id and first.id.startswith("call_") and len(first.id) == len("call_") + 24
    assert first.to_openai() == {"id": first.id, "type": "function", "function": {"name": "a", "arguments": '{"n": 1}'}}
    assert second.to_openai(1) == {"id": second.id, "type": "function", "index": 1,
                                   "function": {"name": "a", "arguments": "{}"}}
    assert first.to_openai(0)["index"] == 0

    tagged = ToolCallParser()
    run(tagged, ['<tool_call>{"name": "a", "arguments": {}}</tool_call>'])
    assert tagged.calls[0].id.startswith("call_") and len(tagged.calls[0].id) == len("call_") + 24


def test_the_forced_call_grammar_wraps_the_schema_of_one_call_in_the_tags() -> None:
    schemas: list[dict] = []

    def to_gbnf(schema: dict) -> str:  # a converter's output: its root, and rules named after it
        schemas.append(schema)
        return 'root ::= "{" root-name "}"\nroot-name ::= "n"\nroots ::= "x"\n'

    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    grammar = forced_call_grammar([{"name": "get_weather", "parameters": weather}], to_gbnf)
    assert grammar == ('root ::= "<tool_call>\\n" tool-call "\\n</tool_call>"\n'
                       'tool-call ::= "{" tool-call-name "}"\ntool-call-name ::= "n"\nroots ::= "x"\n')
    assert schemas[-1] == {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": weather},
                           "required": ["name", "arguments"]}
    forced_call_grammar([{"name": "a", "parameters": weather}, {"name": "b"}], to_gbnf)
    assert schemas[-1] == {"anyOf": [
        {"type": "object", "properties": {"name": {"const": "a"}, "arguments": weather}, "required": ["name", "arguments"]},
        {"type": "object", "properties": {"name": {"const": "b"}, "arguments": {"type": "object"}},
         "required": ["name", "arguments"]}]}  # no parameters: any object


def test_text_streams_at_once_unless_it_may_be_a_bare_call() -> None:
    assert ToolCallParser().feed('{"a": 1}') == ('{"a": 1}', [])  # no declared functions: an object is text
    assert ToolCallParser(["a"]).feed("XX hello") == ("XX hello", [])  # only "{" or a fence may open a call
    parser = ToolCallParser()
    assert parser.feed("<tool_call></tool_call> after") == ("<tool_call></tool_call> after", [])  # an empty body
