"""GBNF for a request's JSON schema: llama-cpp-python's converter (pure Python), with llama.cpp's whitespace rule
and the bounds of integers and numbers enforced, after the schema's own limits (engine/grammar/limits.py)."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from llama_cpp import llama_grammar
from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, RESERVED_NAMES, SchemaConverter

from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.limits import check_schema_limits
from edge_llm.engine.grammar.integer_range import integer_range_rule
from edge_llm.engine.grammar.number_range import number_range_rule

# llama-cpp-python's converter allows one optional space between tokens; llama.cpp's (common/json-schema-to-grammar,
# which llama-server uses) also allows a line break and indentation. The model writes JSON indented, as it learnt
# it: with one space only, every `{\n  ` it prefers is rejected and resampled under the whole grammar.
_PYTHON_SPACE_RULE = re.compile(r'^space ::= " "\?$', re.MULTILINE)
LLAMA_CPP_SPACE_RULE = 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}'
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")

# The characters a `pattern` escapes that a GBNF literal must not: llama-cpp-python's copy of llama.cpp's table
# (common/json-schema-to-grammar.cpp) lacks `^ $ .`, so `\.` in a pattern (versions, e-mail addresses, domains) came
# out as the literal "\.", which GBNF refuses ("unknown escape"): every such schema was a 400. The converter reads
# the module's set on each call; llama.cpp's own table has all three.
llama_grammar.ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS.update("^$.")


class _BoundedNumbers(SchemaConverter):  # type: ignore[misc]
    """llama-cpp-python's converter, with the bounds of integers and numbers enforced (it ignores them;
    engine/grammar/integer_range.py, engine/grammar/number_range.py), and rule names found in linear time."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._key_of: dict[tuple[str, str], str] = {}  # (escaped name, rule) → its rule's name
        self._next_suffix: dict[str, int] = {}  # escaped name → the first suffix not tried yet

    def _add_rule(self, name: str, rule: str) -> str:
        # The converter's own version tries name0, name1, ... from 0 for every rule whose name is taken: quadratic
        # when thousands of names escape to the same one (12,000 properties took 45 s of the tokenizer thread).
        # Same names, same reuse of an identical rule, each suffix tried once.
        escaped = INVALID_RULE_CHARS_RE.sub("-", name)
        if escaped not in self._rules or self._rules[escaped] == rule:
            key = escaped
        else:
            key = self._key_of.get((escaped, rule), "")
            if not key:
                suffix = self._next_suffix.get(escaped, 0)
                while f"{escaped}{suffix}" in self._rules and self._rules[f"{escaped}{suffix}"] != rule:
                    suffix += 1
                key = f"{escaped}{suffix}"
                self._next_suffix[escaped] = suffix + 1
        self._key_of[(escaped, rule)] = key
        self._rules[key] = rule
        return key

    def visit(self, schema: Any, name: str) -> Any:
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind in ("integer", "number") and any(k in schema for k in _BOUNDS):
            lower = _tighter(schema, "minimum", "exclusiveMinimum", 1)
            upper = _tighter(schema, "maximum", "exclusiveMaximum", -1)
            if kind == "integer":
                low, high = _least_integer(*lower, 1), _least_integer(*upper, -1)
                rule = integer_range_rule(low, high)
            else:
                (low, low_inclusive), (high, high_inclusive) = lower, upper
                rule = number_range_rule(low, high, low_inclusive, high_inclusive)
            if not rule:
                raise GrammarError(f"the JSON schema's {kind} bounds admit no {kind} ({low}..{high})")
            return self._add_rule(name + "-" if name in RESERVED_NAMES else name or "root", f"({rule}) space")
        return super().visit(schema, name)


def _tighter(schema: dict, inclusive: str, exclusive: str, step: int) -> tuple[Decimal | None, bool]:
    """The tighter of a schema's inclusive and exclusive bound on one side (lower: step 1, upper: -1), and whether it
    is inclusive; (None, True) when the side is unbounded."""
    bounds = [(Decimal(repr(value)), kind == inclusive) for kind in (inclusive, exclusive)
              if _is_number(value := schema.get(kind)) and math.isfinite(value)]
    if not bounds:
        return None, True
    # the larger lower bound or the smaller upper bound; at a tie the exclusive one
    return max(bounds, key=lambda bound: (bound[0] * step, not bound[1]))


def _least_integer(value: Decimal | None, inclusive: bool, step: int) -> int | None:
    """The least (step 1) or greatest (step -1) integer a bound admits."""
    if value is None:
        return None
    if value == int(value) and not inclusive:
        return int(value) + step
    return math.ceil(value) if step > 0 else math.floor(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _schema_to_gbnf(schema: dict) -> str:
    converter = _BoundedNumbers(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return converter.format_grammar()


def json_schema_to_grammar(schema: dict) -> str:
    """GBNF for a JSON schema, via llama-cpp-python's converter (pure Python) with llama.cpp's whitespace rule and
    the bounds of integers and numbers, after the schema's limits."""
    check_schema_limits(schema)
    try:
        # (on a copy: resolving $refs rewrites the schema in place, and the caller keeps its own)
        return _PYTHON_SPACE_RULE.sub(lambda _: LLAMA_CPP_SPACE_RULE, _schema_to_gbnf(json.loads(json.dumps(schema))))
    except RecursionError:
        raise GrammarError("the JSON schema is nested too deeply") from None
    except GrammarError:
        raise
    except Exception as exc:  # the converter raises assorted errors for schemas it cannot handle
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {exc}") from None
