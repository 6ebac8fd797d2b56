"""The bounds on request grammars and JSON schemas, checked before llama.cpp or the converter see them."""

from __future__ import annotations

from typing import Any

import pytest

from edge_llm.engine.grammar.gbnf.bounds import MAX_STACKS
from edge_llm.engine.grammar.gbnf.syntax import MAX_NESTING
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.limits import MAX_SCHEMA_REPETITION, check_grammar_limits, check_schema_limits

from .token_texts import TOKENS

HUGE = MAX_SCHEMA_REPETITION + 1


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 10**9},
    {"type": "array", "items": {"type": "integer"}, "minItems": HUGE},
    {"type": "object", "properties": {"deep": {"type": "array", "items": {"type": "string", "maxLength": HUGE}}}},
    {"anyOf": [{"type": "string"}, {"type": "object", "maxProperties": 10**12}]},
    {"type": "string", "pattern": "^a{1000000000}$"},
    {"type": "string", "pattern": "x{2,99999999}"},
    {"type": "string", "pattern": "x{ 20000 , }"},
], ids=["minLength", "minItems", "nested maxLength", "in anyOf", "pattern count", "pattern upper", "pattern spaces"])
def test_repetitions_the_converter_would_expand_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError, match="too"):
        check_schema_limits(schema)


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": MAX_SCHEMA_REPETITION},
    {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,8}$"}, "minItems": 1, "maxItems": 10},
    {"type": "object", "properties": {"minLength": {"type": "integer"}}},  # a property named like a keyword
    {"enum": [{"maxLength": "not a count"}, 3]},
    {"type": "string", "pattern": "literal \\{braces\\}"},
], ids=["at the bound", "ordinary", "property named minLength", "enum data", "escaped braces"])
def test_ordinary_schemas_pass(schema: dict[str, Any]) -> None:
    check_schema_limits(schema)


def test_a_schema_nested_beyond_the_python_stack_is_walked_without_recursion() -> None:
    schema: dict[str, Any] = {"type": "string", "minLength": HUGE}
    for _ in range(50_000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarError):
        check_schema_limits(schema)


def test_grammar_limits() -> None:
    check_grammar_limits('root ::= "a" | "b"', TOKENS)
    with pytest.raises(GrammarError, match="parse stacks"):
        check_grammar_limits("root ::= " + " | ".join(f'"{i}"' for i in range(MAX_STACKS + 2)), TOKENS)
    with pytest.raises(GrammarError, match="nests groups"):
        check_grammar_limits("root ::= " + "(" * (MAX_NESTING + 1) + '"a"' + ")" * (MAX_NESTING + 1), TOKENS)
    check_grammar_limits('root ::= "((((|||" [(|]', TOKENS)  # inside literals and classes nothing counts


NESTED = "root ::= " + "(" * 60_000 + "[a]" + ")" * 60_000


@pytest.mark.parametrize("hiding", ['# "\n', '# [\n', "# <\n", 'x ::= <">\n', "x ::= [\\]\"]\n", '#"\r'],
                         ids=["quote in a comment", "bracket in a comment", "angle in a comment", "quote in a token",
                              "escaped bracket in a class", "comment ended by CR"])
def test_nesting_cannot_hide_behind_comments_tokens_or_escapes(hiding: str) -> None:
    # The hostile probe's grammar: llama.cpp skips a comment (a token, a class) whole, so a quote there opens no
    # literal and the 60,000 groups after it reach its recursive parser (a stack overflow, SIGSEGV).
    with pytest.raises(GrammarError, match="nests groups more than 1024 levels"):
        check_grammar_limits(hiding + NESTED, TOKENS)


def test_what_comments_and_tokens_hold_does_not_count() -> None:
    check_grammar_limits("root ::= <|im_end|> x # (((((|||| \"\nx ::= \"a\" # " + "(" * 5000 + "\n", TOKENS)


@pytest.mark.parametrize("pattern", ["^a{1," + " " * (1 << 20), "{" + " " * (1 << 20), "a{1, " * (1 << 17)])
def test_repetition_counts_in_a_megabyte_pattern_are_read_in_one_pass(pattern: str) -> None:
    # `^a{1,` and 30,000 spaces held the tokenizer thread 6-11 s (a quadratic regex); a megabyte ends at once now
    # (this test would not end otherwise), and a real count past the bound is still found.
    check_schema_limits({"type": "string", "pattern": pattern})
    with pytest.raises(GrammarError, match="repeats"):
        check_schema_limits({"type": "string", "pattern": pattern + "b{ 99999 , }"})
