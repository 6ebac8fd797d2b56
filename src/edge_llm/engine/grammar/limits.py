"""Bounds on the grammars and JSON schemas that requests bring, checked before llama.cpp sees them.

Pure Python (the grammar compiler itself is in `llama.runner`, the only package importing llama_cpp).
"""

from __future__ import annotations

import re
from typing import Any

from edge_llm.engine.grammar.gbnf.ambiguity import check_ambiguity
from edge_llm.engine.grammar.gbnf.bounds import GrammarCost, measure
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import parse_gbnf
from edge_llm.engine.grammar.gbnf.tokens import TokenTexts

# Grammars come from request bodies. llama.cpp's grammar parser recurses once per nesting level (a deep one
# overflows the C stack and kills the process) and sampling costs about (parse stacks × vocabulary) per token on
# the engine thread: every grammar is read and measured here (engine/grammar/gbnf) before llama.cpp sees it.
MAX_GRAMMAR_CHARS = 256 * 1024


def check_grammar_limits(grammar: str, tokens: TokenTexts) -> GrammarCost:
    """Refuses (GrammarError) a grammar llama.cpp would fail on, crash on, or that would stall the engine on the
    vocabulary whose token texts are `tokens`."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is too large ({len(grammar)} characters; at most {MAX_GRAMMAR_CHARS})")
    parsed = parse_gbnf(grammar)
    cost = measure(parsed)
    check_ambiguity(parsed, tokens)
    return cost


# llama-cpp-python's schema converter writes a repetition out in full (`"minLength": 10**9` builds a
# string of 10**9 rule references: minutes and gigabytes on the tokenizer thread) before the grammar limits
# above can look at its output. Counts past this are refused first; ordinary schemas stay far below it.
MAX_SCHEMA_REPETITION = 10_000
_COUNT_KEYWORDS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                             "minContains", "maxContains"})
# Possessive quantifiers: nothing is given back, so `{1,` and 30,000 spaces is one linear try (the two `\s*` around
# an empty count were split every way: seconds of the tokenizer thread, issue 41).
_PATTERN_COUNT = re.compile(r"\{\s*+(\d++)\s*+(?:,\s*+(\d*+)\s*+)?\}")


def check_schema_limits(schema: Any) -> None:
    """Refuses repetition counts (keywords, and `{m,n}` in patterns) that the converter would expand."""
    pending = [schema]
    while pending:  # iterative: a deeply nested schema must not overflow the Python stack here
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _COUNT_KEYWORDS and isinstance(value, (int, float)) and value > MAX_SCHEMA_REPETITION:
                raise GrammarError(f"{key} {value} is too large for a grammar (at most {MAX_SCHEMA_REPETITION})")
            if key == "pattern" and isinstance(value, str):
                for match in _PATTERN_COUNT.finditer(value):
                    if any(count and int(count) > MAX_SCHEMA_REPETITION for count in match.groups()):
                        raise GrammarError(f"the pattern repeats {match.group(0)} times, too many for a grammar "
                                           f"(at most {MAX_SCHEMA_REPETITION})")
            if isinstance(value, (dict, list)):
                pending.append(value)
