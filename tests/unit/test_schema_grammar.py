"""engine/llama/schema_grammar.py's converter: llama-cpp-python's, with its rule naming made linear."""

from __future__ import annotations

from typing import Any

import pytest
from llama_cpp.llama_grammar import SchemaConverter

from edge_llm.engine.llama.schema_grammar import _schema_to_gbnf


def upstream(schema: dict[str, Any]) -> str:
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return str(converter.format_grammar())


def colliding(count: int, kinds: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """Properties whose names all escape to `x-` (every CJK character is outside [a-zA-Z0-9-])."""
    names = ["x" + chr(0x4E00 + i) for i in range(count)]
    return {"type": "object", "properties": {n: kinds[i % len(kinds)] for i, n in enumerate(names)}, "required": names}


@pytest.mark.parametrize("schema", [
    colliding(300, ({"type": "string", "maxLength": 5},)),
    colliding(300, ({"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 6}, {"enum": ["a", "b"]})),
    {"type": "object", "properties": {"a b": {"type": "string", "pattern": "^[a-z]{2}$"}, "a-b": {"type": "integer"},
                                      "a.b": {"type": "array", "items": {"type": "string", "maxLength": 3}}}},
], ids=["one rule for all", "three rules in turn", "mixed"])
def test_the_same_grammar_as_the_converter(schema: dict[str, Any]) -> None:
    assert _schema_to_gbnf(schema) == upstream(schema)


def test_twelve_thousand_colliding_names_are_named_in_linear_time() -> None:
    # 45 s of the tokenizer thread with the converter's own naming (name0, name1, ... tried from 0 each time);
    # this test would take minutes otherwise.
    grammar = _schema_to_gbnf(colliding(12_000, ({"type": "string", "maxLength": 5}, {"type": "boolean"})))
    assert "x--kv11998 " in grammar  # each property its own rule: 12,000 of them
