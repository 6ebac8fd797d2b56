"""The GBNF reader (engine/grammar/gbnf/syntax.py) reads what llama.cpp reads, and the bounds (engine/grammar/gbnf/bounds.py) refuse,
naming the rule, what would crash or stall llama.cpp."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge_llm.engine.grammar.gbnf.bounds import (
    MAX_EXPANDED_ELEMENTS,
    MAX_LEFT_CHAIN,
    MAX_LEFT_PATHS,
    MAX_REPETITION_PRODUCT,
    MAX_STACKS,
    measure,
)
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import MAX_NESTING, Ref, Repeat, Terminal, parse_gbnf
from edge_llm.engine.grammar.limits import check_grammar_limits

from .token_texts import TOKENS

LLAMA_CPP_GRAMMARS = sorted((Path(__file__).parents[1] / "fixtures" / "gbnf").glob("*.gbnf"))


def doubling(levels: int) -> str:
    """The hostile probe's grammar: every level doubles the ways the text can be split (2^levels stacks)."""
    lines = ['a0 ::= "x" | ""'] + [f'a{k} ::= a{k - 1} a{k - 1} | ""' for k in range(1, levels + 1)]
    return "\n".join(lines + [f"root ::= a{levels}"]) + "\n"


@pytest.mark.parametrize("path", LLAMA_CPP_GRAMMARS, ids=lambda path: path.name)
def test_llama_cpps_own_grammars_pass(path: Path) -> None:
    assert len(LLAMA_CPP_GRAMMARS) >= 8
    cost = check_grammar_limits(path.read_text(encoding="utf-8"), TOKENS)
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
        check_grammar_limits(grammar, TOKENS)


def test_the_line_of_a_syntax_error_is_named() -> None:
    with pytest.raises(GrammarError, match="line 3"):
        check_grammar_limits('root ::= x\nx ::= "a"\ny ::= "b" )\n', TOKENS)
    with pytest.raises(GrammarError, match="line 2: expecting a rule name"):  # a top-level rule ends at its line
        check_grammar_limits('root ::= "a"\n  | "b"\n', TOKENS)


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
        check_grammar_limits(grammar, TOKENS)


def test_the_stack_bound_counts_what_llama_cpp_opens() -> None:
    assert check_grammar_limits(doubling(8), TOKENS).stacks == 2**8
    assert check_grammar_limits('root ::= ("a" | "b" | "c") "d"', TOKENS).stacks == 3
    enum = "root ::= " + " | ".join(f'"v{i}"' for i in range(MAX_STACKS))
    assert check_grammar_limits(enum, TOKENS).stacks == MAX_STACKS
    with pytest.raises(GrammarError, match="parse stacks"):
        check_grammar_limits(enum + ' | "one more"', TOKENS)


def test_a_long_leftmost_chain_is_refused_before_llama_cpps_recursive_check() -> None:
    rules = [f'r{i} ::= r{i + 1} "x"' for i in range(MAX_LEFT_CHAIN + 5)] + [f'r{MAX_LEFT_CHAIN + 5} ::= "y"']
    with pytest.raises(GrammarError, match="chain of"):
        check_grammar_limits("root ::= r0\n" + "\n".join(rules), TOKENS)
    fine = [f'r{i} ::= r{i + 1} "x"' for i in range(MAX_LEFT_CHAIN - 10)] + [f'r{MAX_LEFT_CHAIN - 10} ::= "y"']
    check_grammar_limits("root ::= r0\n" + "\n".join(fine), TOKENS)


def test_repetition_products_and_expansion_are_bounded() -> None:
    assert measure(parse_gbnf('root ::= ("ab"{3}){5}')).repetition_product == 15
    assert measure(parse_gbnf('root ::= [a-z]{0,20}')).repetition_product == 20
    side = int(MAX_REPETITION_PRODUCT ** 0.5) + 1
    with pytest.raises(GrammarError, match="multiply"):
        check_grammar_limits(f'root ::= x{{{side}}}\nx ::= "a"{{{min(side, 2000)}}}', TOKENS)
    literal = "a" * (MAX_EXPANDED_ELEMENTS // 1000 + 1)
    with pytest.raises(GrammarError, match="expands to"):
        check_grammar_limits(f'root ::= "{literal}"{{1000}}', TOKENS)


def test_nesting_is_read_without_recursion_and_refused_as_soon_as_it_passes_the_bound() -> None:
    deepest = "root ::= " + "(" * MAX_NESTING + '"a"' + ")" * MAX_NESTING  # deeper than Python's recursion limit
    assert parse_gbnf(deepest).max_nesting == MAX_NESTING
    with pytest.raises(GrammarError, match=f"rule 'root' nests groups more than {MAX_NESTING}"):
        parse_gbnf("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000)


def test_ordinary_grammars_pass() -> None:
    for grammar in ['root ::= [a-z]+ ("," [a-z]+)*', 'root ::= "yes" | "no"', 'root ::= ws "x"\nws ::= [ \\t]*',
                    'root ::= ("a" | "b")? "c"', 'root ::= x x x\nx ::= "a"?', 'root ::= "{" (kv ("," kv)*)? "}"\n'
                    'kv ::= [a-z]+ ":" [0-9]+']:
        check_grammar_limits(grammar, TOKENS)


@pytest.mark.parametrize(("grammar", "message"), [
    ('root ::= root "a" | "b"', "grammar rule 'root' is left-recursive (it can start with itself, maybe behind rules "
     "that match nothing): llama.cpp cannot use it"),
    ('root ::= (x)*\nx ::= "a"?', "grammar rule 'root' repeats something that can match nothing: every way of splitting the text "
     "between the repetitions is a path (make the repeated part non-empty)"),
])
def test_a_refused_grammar_is_told_why_and_what_to_change(grammar: str, message: str) -> None:
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(grammar, TOKENS)
    assert str(refused.value) == message


def test_a_leftmost_chain_of_exactly_the_bound_is_accepted_and_one_more_refused() -> None:
    def chain(length: int) -> str:  # root, r0 .. r(length - 2): `length` rules each starting with the next
        rules = [f'r{i} ::= r{i + 1} "x"' for i in range(length - 2)] + [f'r{length - 2} ::= "y"']
        return "root ::= r0\n" + "\n".join(rules)

    check_grammar_limits(chain(MAX_LEFT_CHAIN), TOKENS)
    with pytest.raises(GrammarError, match=f"chain of {MAX_LEFT_CHAIN + 1} rules"):
        check_grammar_limits(chain(MAX_LEFT_CHAIN + 1), TOKENS)


def test_an_optional_rule_that_can_match_nothing_is_allowed_once_but_not_repeated() -> None:
    check_grammar_limits('root ::= x? "a"\nx ::= "b"?', TOKENS)
    with pytest.raises(GrammarError, match="repeats something that can match nothing"):
        check_grammar_limits('root ::= x{0,2} "a"\nx ::= "b"?', TOKENS)


# ---- the cost model, measured exactly (engine/grammar/gbnf/bounds.py's documented counts) -------------------------

@pytest.mark.parametrize(("grammar", "elements"), [
    ('root ::= "abc"', 3 + 1),  # a literal: its characters, and the item's end
    ('root ::= x\nx ::= "a"', (1 + 1) + (1 + 1)),  # a rule reference is one element
    ('root ::= "ab"{2,5}', (2 * 2 + 3 * (2 + 2)) + 1),  # 2 copies, then 3 optional ones each wrapped in 2 more
    ('root ::= "ab"{3}', 2 * 3 + 1),
    ('root ::= "ab"*', (2 * 1 + 1 * (2 + 2)) + 1),  # unbounded: written once, then one optional loop
    ('root ::= "ab"?', (2 * 1 + 1 * (2 + 2)) + 1),
    ('root ::= x{0,3}\nx ::= "a"', (1 * 1 + 3 * (1 + 2)) + 1 + (1 + 1)),
], ids=["literal", "reference", "min-max", "exact", "star", "optional", "optional rule"])
def test_the_expansion_counts_the_elements_llama_cpp_writes(grammar: str, elements: int) -> None:
    assert measure(parse_gbnf(grammar)).expanded_elements == elements


def test_the_expansion_bound_is_inclusive() -> None:
    most = f'"{"a" * 1000}"{{1999}} "{"b" * 998}"'  # 1999 × 1000 + 1, then 998 + 1: exactly the bound
    assert measure(parse_gbnf(f"root ::= {most}")).expanded_elements == MAX_EXPANDED_ELEMENTS
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(f'root ::= {most} "c"', TOKENS)
    assert str(refused.value) == (f"the grammar expands to {MAX_EXPANDED_ELEMENTS + 2} elements once its repetitions "
                                  f"are written out (at most {MAX_EXPANDED_ELEMENTS}): use smaller counts")


@pytest.mark.parametrize(("grammar", "product"), [
    ('root ::= "a"', 1),
    ('root ::= x{2} y{3}\nx ::= "a"{5}\ny ::= "b"{7}', 21),  # the worse of two branches, not their sum
    ('root ::= x{2} y{3}\nx ::= z{5}\ny ::= z{7}\nz ::= "a"{11}', 3 * 7 * 11),  # a rule reached twice counts both ways
    ('root ::= x{0,4}\nx ::= "a"', 4),  # an upper count is what nests
    ('root ::= x* "b"\nx ::= "a"{6}', 6),  # an unbounded repetition counts once
    ('root ::= "b" | x{10}\nx ::= "a" root{10}', 10),  # recursion does not nest its counts again
    ('root ::= x{2}\nx ::= "b" | y{3}\ny ::= "a" x{5}', 2 * 3),  # nor through a rule below the root
    ('root ::= "a"\nunused ::= "b"{2000}', 1),  # only what the root reaches
], ids=["none", "two branches", "shared rule", "upper count", "unbounded", "recursion", "inner recursion",
        "unreachable"])
def test_the_repetition_product_multiplies_counts_through_nesting(grammar: str, product: int) -> None:
    assert measure(parse_gbnf(grammar)).repetition_product == product


def test_the_repetition_product_bound_is_inclusive() -> None:
    assert measure(parse_gbnf('root ::= x{100}\nx ::= "a"{1000}')).repetition_product == MAX_REPETITION_PRODUCT
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits('root ::= x{101}\nx ::= "a"{1000}', TOKENS)
    assert str(refused.value) == f"grammar rule 'root' nests repetitions whose counts multiply to 101000 (at most " \
                                 f"{MAX_REPETITION_PRODUCT})"


@pytest.mark.parametrize(("grammar", "stacks"), [
    ('root ::= "a"? "b"', 2),  # an optional terminal, and what follows it
    ('root ::= "a"{1,3} "b"', 1),  # at least one: what follows is not reached
    ('root ::= x{1} "b"\nx ::= "a"?', 2),  # a rule that can match nothing, once
    ('root ::= x x "c"\nx ::= "a"?', 3),
    ('root ::= x y\nx ::= "a" | ""\ny ::= "b" | ""', 2),  # an empty alternative lets the next rule open its own
    ('root ::= x "c"\nx ::= y\ny ::= z z\nz ::= "a"?', 3),  # can match nothing through a chain of rules
    ('root ::= x "c"\nx ::= y "d"\ny ::= "a"?', 2),  # a rule that needs a terminal hides what follows it
    ('root ::= "a" x x\nx ::= "b"?', 2),  # after the first terminal: rules defined after the one using them
    ('root ::= ""', 0),  # only the empty text: no terminal to check a token against
], ids=["optional", "at least one", "once", "twice", "empty alternatives", "nullable chain", "not nullable",
        "after a terminal", "empty"])
def test_the_stacks_count_each_terminal_reachable_at_a_rules_start(grammar: str, stacks: int) -> None:
    assert measure(parse_gbnf(grammar)).stacks == stacks


def test_stacks_multiplied_along_one_alternative_are_bounded_too() -> None:
    def optional_run(count: int) -> str:  # each optional terminal can be skipped: the first position opens `count`
        return "root ::= " + " ".join(["x"] * count) + '\nx ::= "a"?'

    assert measure(parse_gbnf(optional_run(MAX_STACKS))).stacks == MAX_STACKS
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(optional_run(MAX_STACKS + 1), TOKENS)
    assert str(refused.value) == (f"grammar rule 'root' opens more than {MAX_STACKS} parse stacks at once (alternatives "
                                  "that can match nothing multiply them): llama.cpp would check every token against "
                                  "each")
    enum = "root ::= " + " | ".join(f'"v{i}"' for i in range(MAX_STACKS + 1))
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(enum, TOKENS)
    assert str(refused.value) == (f"grammar rule 'root' opens {MAX_STACKS + 1} parse stacks at once (at most "
                                  f"{MAX_STACKS}): use fewer alternatives, or fewer that can match nothing")


@pytest.mark.parametrize(("grammar", "refused"), [
    ('root ::= (x)*\nx ::= y z\ny ::= "a"?\nz ::= w*\nw ::= "b"', True),  # nullable through two rules
    ('root ::= (x)*\nx ::= y z\ny ::= "a"?\nz ::= w+\nw ::= "b"', False),  # one of them needs a "b"
    ('root ::= (x)*\nx ::= "c" | y\ny ::= z\nz ::= "a"? "b"?', True),  # through its second alternative
    ('root ::= (x)*\nx ::= y y\ny ::= "a" | z\nz ::= ""', True),  # an empty literal matches nothing
    ('root ::= (x)*\nx ::= y "c"\ny ::= "a"?', False),
    ('root ::= x*\nx ::= z y\ny ::= "a"{0,2}\nz ::= y', True),  # waiting on a rule found nullable later
    ('root ::= (x)*\nx ::= "a"? "b"', False),  # an optional item does not make the rest optional
    ('root ::= x (z)*\nx ::= y "c"\nz ::= y\ny ::= "a"?', True),  # y's first user needs text, its second not
], ids=["two rules", "one needs text", "second alternative", "empty literal", "needs text", "found later",
        "optional then text", "second user"])
def test_a_rule_that_can_match_nothing_is_found_through_other_rules(grammar: str, refused: bool) -> None:
    if refused:
        with pytest.raises(GrammarError, match="repeats something that can match nothing"):
            check_grammar_limits(grammar, TOKENS)
    else:
        check_grammar_limits(grammar, TOKENS)


def test_stacks_opened_after_a_terminal_are_bounded_like_those_at_the_start() -> None:
    """`"a" x x … x` with optional `x`s: after the "a", every `x` can be skipped, as at a rule's start (this was
    counted as 1 when the rules came after the one using them)."""
    def after_a_terminal(count: int) -> str:
        return 'root ::= "a" ' + " ".join(["x"] * count) + '\nx ::= "b"?'

    assert measure(parse_gbnf(after_a_terminal(MAX_STACKS))).stacks == MAX_STACKS
    with pytest.raises(GrammarError, match=f"rule 'root' opens more than {MAX_STACKS} parse stacks"):
        check_grammar_limits(after_a_terminal(MAX_STACKS + 1), TOKENS)


def test_the_leftmost_paths_over_every_rule_are_bounded_inclusively() -> None:
    """Rules that match nothing open no stacks but multiply the leftmost paths llama.cpp's check walks: `b` starts
    with `e` in 1,000 ways (1 + 1,000 paths), `root` with `b` in `m` ways (1 + 1,001 m); `e` has 1, each `p` 1."""
    def grammar(m: int, pads: int) -> str:
        return "\n".join([f"root ::= {' '.join(['b'] * m)}", f"b ::= {' '.join(['e'] * 1000)}", 'e ::= ""']
                         + [f'p{i} ::= "x"' for i in range(pads)])

    def total(m: int, pads: int) -> int:
        return (1 + 1001 * m) + 1001 + 1 + pads

    assert total(997, 1000) == MAX_LEFT_PATHS
    check_grammar_limits(grammar(997, 1000), TOKENS)
    with pytest.raises(GrammarError) as refused:
        check_grammar_limits(grammar(997, 1001), TOKENS)
    assert str(refused.value) == (f"grammar rule 'root' can start in too many ways ({1 + 1001 * 997} leftmost paths; "
                                  f"at most {MAX_LEFT_PATHS} in all): make alternatives that match nothing explicit")
