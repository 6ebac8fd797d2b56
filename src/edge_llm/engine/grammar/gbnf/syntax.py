"""A GBNF parser that reads a grammar exactly as llama.cpp's does (src/llama-grammar.cpp, `llama_grammar_parser`),
without recursion, into rules of items that `bounds` can measure.

llama.cpp's parser recurses once per nested group and its left-recursion check once per rule of a leftmost chain:
a grammar from a request must be read, and bounded, before either sees it. Pure Python, one linear pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_llm.engine.grammar.errors import GrammarError

MAX_NESTING = 1024  # groups inside groups (llama.cpp's parser recurses per level): refused as soon as it is passed
# llama.cpp's MAX_REPETITION_THRESHOLD: `{m}` above it is an error, `{m,n}` above it is read as `{m,}`.
MAX_REPETITION = 2000


# The characters one terminal position accepts: (negated, ranges as (low, high) code points); `.` is (True, ()).
CharSet = tuple[bool, tuple[tuple[int, int], ...]]
ANY_CHAR: CharSet = (True, ())


@dataclass(frozen=True, slots=True)
class Terminal:
    """A literal's characters (`length` of them, 0 for `""`), a character class, `.`, or a token.

    `chars` holds what each position accepts (`ambiguity` follows them); empty for a token, which no character
    matches (llama.cpp checks a token by its id and never splits it)."""

    length: int = 1
    chars: tuple[CharSet, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Ref:
    rule: int  # index into Grammar.rules


@dataclass(frozen=True, slots=True)
class Repeat:
    item: Terminal | Ref
    min: int
    max: int | None  # None: unbounded


Item = Terminal | Ref | Repeat


@dataclass(slots=True)
class Rule:
    name: str  # a group's generated rule is named after the rule it appears in, as llama.cpp names it
    alternatives: list[list[Item]] = field(default_factory=list)
    defined: bool = False


@dataclass(slots=True)
class Grammar:
    rules: list[Rule]
    names: dict[str, int]  # the named (written) rules
    max_nesting: int  # the deepest group nesting

    def rule_named(self, name: str) -> int | None:
        return self.names.get(name)


_ESCAPED = {"t": "\t", "r": "\r", "n": "\n"}


def _is_word(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char == "-")


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < len(self.text) else ""

    def fail(self, message: str) -> GrammarError:
        snippet = self.text[self.pos:self.pos + 24]
        line = self.text.count("\n", 0, self.pos) + 1
        return GrammarError(f"grammar syntax error at line {line}: {message} (at {snippet!r})")

    def space(self, newline_ok: bool) -> None:
        text, pos = self.text, self.pos
        while pos < len(text):
            char = text[pos]
            if char in " \t" or (newline_ok and char in "\r\n"):
                pos += 1
            elif char == "#":
                while pos < len(text) and text[pos] not in "\r\n":
                    pos += 1
            else:
                break
        self.pos = pos

    def name(self) -> str:
        start = self.pos
        while _is_word(self.peek()):
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a rule name")
        return self.text[start:self.pos]

    def integer(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting an integer")
        digits = self.text[start:self.pos]
        return int(digits) if len(digits) <= 12 else 10**12  # the exact value of a huge count does not matter

    def char(self) -> int:
        """Reads one literal or class character with llama.cpp's escapes: its code point."""
        if self.peek() == "\\":
            kind = self.peek(1)
            hex_digits = {"x": 2, "u": 4, "U": 8}.get(kind)
            if hex_digits is not None:
                digits = self.text[self.pos + 2:self.pos + 2 + hex_digits]
                if len(digits) != hex_digits or any(d not in "0123456789abcdefABCDEF" for d in digits):
                    raise self.fail(f"expecting {hex_digits} hex digits")
                self.pos += 2 + hex_digits
                return int(digits, 16)
            if kind and kind in 'trn\\"[]-':
                self.pos += 2
                return ord(_ESCAPED.get(kind, kind))
            raise self.fail("unknown escape")
        if self.peek():
            self.pos += 1
            return ord(self.text[self.pos - 1])
        raise self.fail("unexpected end of input")


@dataclass(slots=True)
class _Group:
    """A rule body being read: its rule, the alternatives so far, and whether newlines may separate items."""

    rule: int
    nested: bool
    sequence: list[Item] = field(default_factory=list)
    # llama.cpp's `n_prev_rules`: rules the last item's repetitions will generate (its product is bounded).
    last_rules: int = 1
    repeatable: bool = False  # an item was just written (not an empty literal, not the sequence's start)
    symbols_before: int = 0  # llama.cpp's symbol count before this group's own


class _Parser:
    def __init__(self, text: str) -> None:
        self.reader = _Reader(text)
        self.rules: list[Rule] = []
        self.names: dict[str, int] = {}
        self.max_nesting = 0
        self.repetition_rules = 0  # the rules llama.cpp generates for repetitions (counted like its symbols)

    def symbol(self, name: str) -> int:
        index = self.names.get(name)
        if index is None:
            index = self.names[name] = len(self.rules)
            self.rules.append(Rule(name))
        return index

    def generated(self, parent: str) -> int:
        self.rules.append(Rule(parent, defined=True))
        return len(self.rules) - 1

    def parse(self) -> Grammar:
        reader = self.reader
        reader.space(True)
        while reader.pos < len(reader.text):
            self.rule()
        for rule in self.rules:
            if not rule.defined:
                raise GrammarError(f"grammar rule '{rule.name}' is used but not defined")
        return Grammar(self.rules, self.names, self.max_nesting)

    def rule(self) -> None:
        reader = self.reader
        name = reader.name()
        reader.space(False)
        if reader.text[reader.pos:reader.pos + 3] != "::=":
            raise reader.fail("expecting ::=")
        reader.pos += 3
        reader.space(True)
        index = self.symbol(name)
        self.rules[index].defined = True
        self.rules[index].alternatives = []  # a rule written twice: the last definition wins, as in llama.cpp
        self.body(name, index)
        char = reader.peek()
        if char == "\r":
            reader.pos += 2 if reader.peek(1) == "\n" else 1
        elif char == "\n":
            reader.pos += 1
        elif char:
            raise reader.fail("expecting a newline or the end")
        reader.space(True)

    def body(self, name: str, index: int) -> None:
        """A rule's alternatives, groups included, with an explicit stack instead of recursion."""
        reader = self.reader
        stack = [_Group(index, nested=False)]
        while stack:
            group = stack[-1]
            if self.item(name, group, stack):
                continue
            if len(stack) > self.max_nesting:
                self.max_nesting = len(stack) - 1
            # The sequence ended: another alternative, the end of a group, or the end of the rule body.
            self.rules[group.rule].alternatives.append(group.sequence)
            if reader.peek() == "|":
                reader.pos += 1
                reader.space(True)
                group.sequence = []
                group.last_rules = 1
                group.repeatable = False
                continue
            stack.pop()
            if not stack:
                return
            if reader.peek() != ")":
                raise reader.fail("expecting ')'")
            reader.pos += 1
            outer = stack[-1]
            reader.space(outer.nested)
            outer.sequence.append(Ref(group.rule))
            outer.last_rules = max(1, len(self.rules) + self.repetition_rules - group.symbols_before)
            outer.repeatable = True

    def item(self, name: str, group: _Group, stack: list[_Group]) -> bool:
        """Reads one item (or a repetition of the last one) into `group`; False at the end of a sequence."""
        reader = self.reader
        char = reader.peek()
        if char == '"':
            reader.pos += 1
            chars: list[CharSet] = []
            while reader.peek() != '"':
                if not reader.peek():
                    raise reader.fail("unexpected end of input in a literal")
                code = reader.char()
                chars.append((False, ((code, code),)))
            reader.pos += 1
            length = len(chars)
            # An empty literal writes nothing: a repetition after it has no item to repeat, as in llama.cpp.
            if length:
                group.sequence.append(Terminal(length, tuple(chars)))
            group.last_rules = 1
            group.repeatable = length > 0
            reader.space(group.nested)
            return True
        elif char == "[":
            reader.pos += 1
            negated = reader.peek() == "^"
            if negated:
                reader.pos += 1
            ranges: list[tuple[int, int]] = []
            while reader.peek() != "]":
                if not reader.peek():
                    raise reader.fail("unexpected end of input in a character class")
                low = high = reader.char()
                if reader.peek() == "-" and reader.peek(1) != "]":
                    if not reader.peek(1):
                        raise reader.fail("unexpected end of input in a character class")
                    reader.pos += 1
                    high = reader.char()
                ranges.append((low, high))
            reader.pos += 1
            group.sequence.append(Terminal(1, ((negated, tuple(ranges)),)))
            group.last_rules = 1
        elif char in ("<", "!"):
            self.token()
            group.sequence.append(Terminal())
            group.last_rules = 1
        elif _is_word(char):
            group.sequence.append(Ref(self.symbol(reader.name())))
            group.last_rules = 1
        elif char == "(":
            reader.pos += 1
            reader.space(True)
            if len(stack) > MAX_NESTING:
                raise GrammarError(f"grammar rule '{name}' nests groups more than {MAX_NESTING} levels deep")
            before = len(self.rules) + self.repetition_rules
            stack.append(_Group(self.generated(name), nested=True, symbols_before=before))
            return True
        elif char == ".":
            reader.pos += 1
            group.sequence.append(Terminal(1, (ANY_CHAR,)))
            group.last_rules = 1
        elif char in ("*", "+", "?"):
            reader.pos += 1
            reader.space(group.nested)
            self.repeat(group, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[char])
            return True
        elif char == "{":
            reader.pos += 1
            reader.space(group.nested)
            self.repeat(group, *self.counts(group))
            return True
        else:
            return False
        group.repeatable = True
        reader.space(group.nested)
        return True

    def token(self) -> None:
        reader = self.reader
        if reader.peek() == "!":
            reader.pos += 1
        if reader.peek() != "<":
            raise reader.fail("expecting '<'")
        reader.pos += 1
        if reader.peek() == "[":
            reader.pos += 1
            if reader.integer() > 0xFFFFFFFF:
                raise reader.fail("the token id is too large")
            if reader.peek() != "]" or reader.peek(1) != ">":
                raise reader.fail("expecting ']>'")
            reader.pos += 2
            return
        end = reader.text.find(">", reader.pos)
        if end < 0:
            raise reader.fail("expecting '>'")
        reader.pos = end + 1  # whether it is one token of the vocabulary, llama.cpp checks

    def counts(self, group: _Group) -> tuple[int, int | None]:
        reader = self.reader
        if not (reader.peek().isascii() and reader.peek().isdigit()):
            raise reader.fail("expecting an integer")
        low = reader.integer()
        reader.space(group.nested)
        high: int | None
        if reader.peek() == "}":
            high = low
        elif reader.peek() == ",":
            reader.pos += 1
            reader.space(group.nested)
            high = None
            if reader.peek().isascii() and reader.peek().isdigit():
                high = reader.integer()
                reader.space(group.nested)
            if reader.peek() != "}":
                raise reader.fail("expecting '}'")
        else:
            raise reader.fail("expecting ',' or '}'")
        reader.pos += 1
        reader.space(group.nested)
        if low > MAX_REPETITION:
            raise reader.fail(f"a repetition of {low} is more than {MAX_REPETITION}")
        if high is not None and high < low:
            # llama.cpp counts max - min optional copies unsigned: 2^64 of them, gigabytes before it gives up
            raise reader.fail(f"the repetition {{{low},{high}}} has its maximum below its minimum")
        if high is not None and high > MAX_REPETITION:
            high = None  # llama.cpp reads it as unbounded
        return low, high

    def repeat(self, group: _Group, low: int, high: int | None) -> None:
        if not group.repeatable:
            raise self.reader.fail("expecting an item before */+/?/{")
        generated = high if high is not None and high > 0 else (low if low > 0 else 1)
        if group.last_rules * generated > MAX_REPETITION:
            raise self.reader.fail(f"the repetitions multiply to more than {MAX_REPETITION} rules")
        group.last_rules *= generated
        self.repetition_rules += 1 if high is None else high - low
        last = group.sequence.pop()
        if isinstance(last, Repeat):  # `x{2}{3}`: llama.cpp repeats what the last repetition wrote
            if last.min == 0 and (high is None or high > 1):
                raise GrammarError(f"grammar rule '{self.rules[group.rule].name}' repeats something that can match "
                                   "nothing (a repetition of an optional part)")
            last = Repeat(last.item, last.min * low, None if last.max is None or high is None else last.max * high)
            group.sequence.append(last)
            return
        group.sequence.append(Repeat(last, low, high))


def parse_gbnf(text: str) -> Grammar:
    """Reads a GBNF grammar as llama.cpp does; raises `GrammarError` where llama.cpp's parser would fail."""
    return _Parser(text).parse()
