"""The GBNF reader (engine/grammar/gbnf/syntax.py) reads what llama.cpp reads, and the bounds (engine/grammar/gbnf/bounds.py) refuse,
naming the rule, what would crash or stall llama.cpp."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge_llm.engine.grammar.gbnf.bounds import (
    MAX_EXPANDED_ELEMENTS,
    MAX_LEFT_CHAIN,
    MAX_REPETITION_PRODUCT,
    MAX_STACKS,
    measure,
)
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import MAX_NESTING, Ref, Repeat, Terminal, parse_gbnf
from edge_llm.engine.grammar.limits import check_grammar_limits

LLAMA_CPP_GRAMMARS = sorted((Path(__file__).parents[1] / "fixtures" / "gbnf").glob("*.gbnf"))


def doubling(levels: int) -> str:
    """The hostile probe's grammar: every level doubles the ways the text can be split (2^levels stacks)."""
    lines = ['a0 ::= "x" | ""'] + [f'a{k} ::= a{k - 1} a{k - 1} | ""' for k in range(1, levels + 1)]
    return "\n".join(lines + [f"root ::= a{levels}"]) + "\n"


@pytest.mark.parametrize("path", LLAMA_CPP_GRAMMARS, ids=lambda path: path.name)
def test_llama_cpps_own_grammars_pass(path: Path) -> None:
    assert len(LLAMA_CPP_GRAMMARS) >= 8
    cost = check_grammar_limits(path.read_text(encoding="utf-8"))
    assert 1 <= cost.stacks <= 64


def test_literals_classes_escapes_and_comments_are_read_as_llama_cpp_reads_them() -> None:
    grammar = parse_gbnf(
        '# a comment with "quotes" [brackets] (parens\n'
        'root ::= "a\\"b\\x41\\u00e9\\U0001F600" [^\\]\\-a-z\\t] x |  # trailing ((( comment\n'
        '  <[42]> !<|im_end|> . "" \n'
        'x ::= ("(" | ")")+ "#"?\n'
    )
    root = grammar.rules[grammar.names["root"]]
    assert root.alternatives[0] == [Terminal(6), Terminal(), Ref(grammar.names["x"])]
    assert root.alternatives[1] == [Terminal(), Terminal(), Terminal()]  # the empty literal writes nothing
    x = grammar.rules[grammar.names["x"]]
    assert isinstance(x.alternatives[0][0], Repeat) and x.alternatives[0][0].min == 1
    assert x.alternatives[0][1] == Repeat(Terminal(1), 0, 1)
    assert grammar.max_nesting == 1


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= "a', "unexpected end of input in a literal"),
    ("root ::= [a-", "unexpected end of input"),
    ('root ::= "\\q"', "unknown escape"),
    ('root ::= "\\x4"', "expecting 2 hex digits"),
    ("root ::= * ", "expecting an item before"),
    ('root ::= "" +', "expecting an item before"),
    ("root ::= \"a\"{x}", "expecting an integer"),
    ("root ::= \"a\"{1,2", "expecting '}'"),
    ("root ::= \"a\"{2001}", "more than 2000"),
    ('root ::= "a"{3,2}', "maximum below its minimum"),  # llama.cpp: 2^64 optional copies, gigabytes then a refusal
    ('root ::= ("a"', "expecting ')'"),
    ('root := "a"', "expecting ::="),
    ('root ::= "a" )', "expecting a newline or the end"),
    ('root ::= <[99999999999]>', "too large"),
    ('root ::= x', "'x' is used but not defined"),
    ('other ::= "a"', "no 'root' rule"),
    ('root ::= (("a"){0,50}){0,50}', "multiply to more than 2000 rules"),
], ids=lambda value: value if len(value) < 30 else value[:30])
def test_what_llama_cpp_refuses_is_refused_with_a_reason(grammar: str, message: str) -> None:
    with pytest.raises(GrammarError, match=re.escape(message)):
        check_grammar_limits(grammar)


def test_the_line_of_a_syntax_error_is_named() -> None:
    with pytest.raises(GrammarError, match="line 3"):
        check_grammar_limits('root ::= x\nx ::= "a"\ny ::= "b" )\n')
    with pytest.raises(GrammarError, match="line 2: expecting a rule name"):  # a top-level rule ends at its line
        check_grammar_limits('root ::= "a"\n  | "b"\n')


@pytest.mark.parametrize(("grammar", "rule", "reason"), [
    ('root ::= ("a"? | "b"?){0,40}', "root", "repeats something that can match nothing"),
    ('root ::= (x)*\nx ::= "a"?', "root", "repeats something that can match nothing"),
    ('root ::= "x"?*', "root", "repeats something that can match nothing"),
    ('root ::= x "a"\nx ::= y root\ny ::= "b"?', "(root|x|y)", "left-recursive"),
    ('root ::= root "a" | "b"', "root", "left-recursive"),
    (doubling(16), "a1[0-9]", "parse stacks"),
    (doubling(40), "(root|a[0-9]+)", "(parse stacks|too many ways)"),
    ('root ::= x{1,2000}\nx ::= "a"{1,2000}', "root", "multiply to 4000000"),
], ids=["nullable alternatives repeated", "nullable rule repeated", "optional repeated", "left recursion behind a "
        "nullable rule", "direct left recursion", "doubling 16", "doubling 40", "nested counts through a rule"])
def test_grammars_whose_cost_is_unbounded_are_refused_naming_the_rule(grammar: str, rule: str, reason: str) -> None:
    with pytest.raises(GrammarError, match=f"rule '{rule}'.*{reason}"):
        check_grammar_limits(grammar)


def test_the_stack_bound_counts_what_llama_cpp_opens() -> None:
    assert check_grammar_limits(doubling(8)).stacks == 2**8
    assert check_grammar_limits('root ::= ("a" | "b" | "c") "d"').stacks == 3
    enum = "root ::= " + " | ".join(f'"v{i}"' for i in range(MAX_STACKS))
    assert check_grammar_limits(enum).stacks == MAX_STACKS
    with pytest.raises(GrammarError, match="parse stacks"):
        check_grammar_limits(enum + ' | "one more"')


def test_a_long_leftmost_chain_is_refused_before_llama_cpps_recursive_check() -> None:
    rules = [f'r{i} ::= r{i + 1} "x"' for i in range(MAX_LEFT_CHAIN + 5)] + [f'r{MAX_LEFT_CHAIN + 5} ::= "y"']
    with pytest.raises(GrammarError, match="chain of"):
        check_grammar_limits("root ::= r0\n" + "\n".join(rules))
    fine = [f'r{i} ::= r{i + 1} "x"' for i in range(MAX_LEFT_CHAIN - 10)] + [f'r{MAX_LEFT_CHAIN - 10} ::= "y"']
    check_grammar_limits("root ::= r0\n" + "\n".join(fine))


def test_repetition_products_and_expansion_are_bounded() -> None:
    assert measure(parse_gbnf('root ::= ("ab"{3}){5}')).repetition_product == 15
    assert measure(parse_gbnf('root ::= [a-z]{0,20}')).repetition_product == 20
    side = int(MAX_REPETITION_PRODUCT ** 0.5) + 1
    with pytest.raises(GrammarError, match="multiply"):
        check_grammar_limits(f'root ::= x{{{side}}}\nx ::= "a"{{{min(side, 2000)}}}')
    literal = "a" * (MAX_EXPANDED_ELEMENTS // 1000 + 1)
    with pytest.raises(GrammarError, match="expands to"):
        check_grammar_limits(f'root ::= "{literal}"{{1000}}')


def test_nesting_is_read_without_recursion_and_refused_as_soon_as_it_passes_the_bound() -> None:
    deepest = "root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING  # deeper than Python's recursion limit
    assert parse_gbnf(deepest).max_nesting == MAX_NESTING
    with pytest.raises(GrammarError, match=f"rule 'root' nests groups more than {MAX_NESTING}"):
        parse_gbnf("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000)


def test_ordinary_grammars_pass() -> None:
    for grammar in ['root ::= [a-z]+ ("," [a-z]+)*', 'root ::= "yes" | "no"', 'root ::= ws "x"\nws ::= [ \\t]*',
                    'root ::= ("a" | "b")? "c"', 'root ::= x x x\nx ::= "a"?', 'root ::= "{" (kv ("," kv)*)? "}"\n'
                    'kv ::= [a-z]+ ":" [0-9]+']:
        check_grammar_limits(grammar)


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= root "a" | "b"', "grammar rule 'root' is left-recursive (it can start with itself, maybe behind rules "
     "that match nothing): llama.cpp cannot use it"),
    ('root ::= (x)*\nx ::= "a"?', "grammar rule 'root' repeats something that can match nothing: every way of splitting the text "
     "between the repetitions is a path (make the repeated part non-empty)"),
])
def test_a_refused_grammar_is_told_why_and_what_to_change(grammar: str, message: str) -> None:
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(grammar)
    assert str(refused.value) == message


def test_a_leftmost_chain_of_exactly_the_bound_is_accepted_and_one_more_refused() -> None:
    def chain(length: int) -> str:  # root, r0 .. r(length - 2): `length` rules each starting with the next
        rules = [f'r{i} ::= r{i + 1} "x"' for i in range(length - 2)] + [f'r{length - 2} ::= "y"']
        return "root ::= r0\n" + "\n".join(rules)

    check_grammar_limits(chain(MAX_LEFT_CHAIN))
    with pytest.raises(GrammarError, match=f"chain of {MAX_LEFT_CHAIN + 1} rules"):
        check_grammar_limits(chain(MAX_LEFT_CHAIN + 1))


def test_an_optional_rule_that_can_match_nothing_is_allowed_once_but_not_repeated() -> None:
    check_grammar_limits('root ::= x? "a"\nx ::= "b"?')
    with pytest.raises(GrammarError, match="repeats something that can match nothing"):
        check_grammar_limits('root ::= x{0,2} "a"\nx ::= "b"?')
