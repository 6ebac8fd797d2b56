"""Bounds on the grammars and JSON schemas that requests bring, checked before llama.cpp sees them.

Pure Python (the grammar compiler itself is in `runner`, the only module importing llama_cpp).
"""

from __future__ import annotations

import re
from typing import Any


class GrammarError(ValueError):
    """A grammar (or the JSON schema it came from) that llama.cpp cannot, or must not, use."""


# Grammars come from request bodies. llama.cpp's grammar parser recurses once per nesting level, so a
# deep one (a JSON schema with `"maxLength": 1000000`) overflows the C stack and kills the process; and
# sampling costs about (alternatives open at a point × vocabulary) per token on the engine thread, so a
# huge `enum` stalls every sequence. Both are bounded before llama.cpp sees a grammar.
MAX_GRAMMAR_CHARS = 256 * 1024
MAX_GRAMMAR_NESTING = 1024
MAX_GRAMMAR_ALTERNATIVES = 2048  # `|`, `?` and `*` outside literals: a bound on the grammar stacks


def check_grammar_limits(grammar: str) -> None:
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is too large ({len(grammar)} characters; at most {MAX_GRAMMAR_CHARS})")
    alternatives = depth = deepest = 0
    closing = ""  # the end of the literal ('"') or character class (']') being read, if any
    escaped = False
    for char in grammar:  # one linear pass (no regular expression that could backtrack)
        if escaped:
            escaped = False
        elif closing:
            if char == "\\":
                escaped = True
            elif char == closing:
                closing = ""
        elif char == '"' or char == "[":
            closing = '"' if char == '"' else "]"
        elif char in "|?*":
            alternatives += 1
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    if alternatives > MAX_GRAMMAR_ALTERNATIVES:
        raise GrammarError(f"the grammar is too complex ({alternatives} alternatives; at most "
                           f"{MAX_GRAMMAR_ALTERNATIVES}): use a smaller enum or fewer optional parts")
    if deepest > MAX_GRAMMAR_NESTING:
        raise GrammarError(f"the grammar is nested too deeply ({deepest} levels; at most {MAX_GRAMMAR_NESTING}): "
                           "lower maxLength / maxItems")


# llama-cpp-python's schema converter writes a repetition out in full (`"minLength": 10**9` builds a
# string of 10**9 rule references: minutes and gigabytes on the tokenizer thread) before the grammar limits
# above can look at its output. Counts past this are refused first; ordinary schemas stay far below it.
MAX_SCHEMA_REPETITION = 10_000
_COUNT_KEYWORDS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                             "minContains", "maxContains"})
_PATTERN_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


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
