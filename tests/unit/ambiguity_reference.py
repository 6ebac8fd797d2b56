"""The ambiguity check as it was before it grouped characters and remembered its choices (issue 41): each step
tried every candidate character against every stack and looked each one up in the token texts. Kept only as the
slow reference that test_gbnf_ambiguity.py compares the product's check (engine/grammar/gbnf/ambiguity.py) with."""

from __future__ import annotations

import logging

from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import CharSet, Grammar, Item, Ref, Repeat, Terminal
from edge_llm.engine.grammar.gbnf.tokens import Prefix, TokenTexts

logger = logging.getLogger(__name__)

MAX_PATHS = 100_000  # walks of one candidate token through the grammar's stacks
MAX_WORK = 5_000_000  # stack advances, matches and character choices over the whole check

# A frame: (rule, alternative, item, repetitions done, character within the terminal; -1 while a repetition
# decides whether to go on). A stack: a number given by `_Stacks` (0: the empty stack).
Frame = tuple[int, int, int, int, int]
Stack = int
# Characters tried for a negated class or a wide range (where long tokens are made of): the others are all tried.
_PROBES = tuple(map(ord, " \n\t\r" + "aeAE0_-=+*/\\#.,:;!?'\"`~^|&%$@<>()[]{}" + "éä中の"))
_WHOLE_RANGE = 8  # a range this narrow is tried whole


class _Stacks:
    """Stacks interned as numbers, each a frame on a stack below it: a push is one lookup, and a stack is
    compared and hashed in constant time however deep it is (a chain of 1 024 rules makes deep ones)."""

    def __init__(self) -> None:
        self.top: list[Frame] = [(-1, -1, -1, -1, -1)]
        self.below: list[Stack] = [0]
        self.bottom: list[Frame] = [(-1, -1, -1, -1, -1)]  # the frame a stack started from (where it was left)
        self._numbers: dict[tuple[Stack, Frame], Stack] = {}

    def push(self, below: Stack, frame: Frame) -> Stack:
        number = self._numbers.get((below, frame))
        if number is None:
            number = self._numbers[(below, frame)] = len(self.top)
            self.top.append(frame)
            self.below.append(below)
            self.bottom.append(self.bottom[below] if below else frame)
        return number


class _Walker:
    def __init__(self, grammar: Grammar, tokens: TokenTexts) -> None:
        self.tokens = tokens
        self.rules = _without_empty_rules(grammar)
        self.names = [rule.name for rule in grammar.rules]
        self.work = 0
        self.current = ""
        self._advanced: dict[Stack, tuple[Stack, ...]] = {}
        self.stacks = _Stacks()
        self._matched: dict[tuple[CharSet, int], bool] = {}

    # ---- llama.cpp's stack machine -----------------------------------------------------------------

    def frame(self, rule: int, alternative: int, index: int) -> Frame:
        return (rule, alternative, index, 0, -1 if isinstance(self.rules[rule][alternative][index], Repeat) else 0)

    def _next(self, base: Stack, rule: int, alternative: int, index: int) -> Stack:
        """`base` with the item after `index` on top; `base` itself when the alternative ends there (llama.cpp
        does not push the end of a sequence)."""
        if index + 1 < len(self.rules[rule][alternative]):
            return self.stacks.push(base, self.frame(rule, alternative, index + 1))
        return base

    def _repeated(self, base: Stack, frame: Frame, item: Repeat) -> Stack:
        """The stack once repetition number `done` of `item` has been matched."""
        rule, alternative, index, done, _ = frame
        done += 1
        if item.max is not None and done >= item.max:
            return self._next(base, rule, alternative, index)
        if item.max is None:
            done = min(done, item.min)  # past its minimum an endless repetition is the same place again
        return self.stacks.push(base, (rule, alternative, index, done, -1))

    def advance(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks `stack` becomes with a terminal on top, each once; `()` when the start frame ended."""
        cached = self._advanced.get(stack)
        if cached is not None:
            return cached
        found: dict[Stack, None] = {}
        seen: set[Stack] = set()
        todo = [stack]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            self._spend(1)
            if not current:
                found[current] = None
                continue
            frame = self.stacks.top[current]
            rule, alternative, index, done, char = frame
            sequence = self.rules[rule][alternative]
            base = self.stacks.below[current]
            item = sequence[index]
            if isinstance(item, Terminal):
                found[current] = None
            elif isinstance(item, Ref):
                self._call(todo, self._next(base, rule, alternative, index), item.rule)
            elif char >= 0:
                found[current] = None  # inside a repeated terminal
            else:
                if done >= item.min:
                    todo.append(self._next(base, rule, alternative, index))
                if item.max is None or done < item.max:
                    if isinstance(item.item, Terminal):
                        todo.append(self.stacks.push(base, (rule, alternative, index, done, 0)))
                    else:
                        assert isinstance(item.item, Ref)
                        self._call(todo, self._repeated(base, frame, item), item.item.rule)
        result = tuple(found)
        self._advanced[stack] = result
        return result

    def _call(self, todo: list[Stack], base: Stack, rule: int) -> None:
        for number, sequence in enumerate(self.rules[rule]):
            todo.append(self.stacks.push(base, self.frame(rule, number, 0)) if sequence else base)

    def top_chars(self, stack: Stack) -> CharSet | None:
        """What the terminal on top of `stack` accepts; None for a token (matched by id, never split)."""
        rule, alternative, index, _, char = self.stacks.top[stack]
        item: Item = self.rules[rule][alternative][index]
        terminal = item.item if isinstance(item, Repeat) else item
        assert isinstance(terminal, Terminal)
        return terminal.chars[char] if terminal.chars else None

    def after(self, stack: Stack) -> Stack:
        """`stack` once the character on its top is matched."""
        frame = self.stacks.top[stack]
        rule, alternative, index, done, char = frame
        item = self.rules[rule][alternative][index]
        base = self.stacks.below[stack]
        terminal = item.item if isinstance(item, Repeat) else item
        assert isinstance(terminal, Terminal)
        if char + 1 < terminal.length:
            return self.stacks.push(base, (rule, alternative, index, done, char + 1))
        if isinstance(item, Repeat):
            return self._repeated(base, frame, item)
        return self._next(base, rule, alternative, index)

    # ---- counting walks --------------------------------------------------------------------------

    def _spend(self, amount: int) -> None:
        self.work += amount
        if self.work > MAX_WORK:
            raise GrammarError(f"grammar rule '{self.current}' is too costly to check for ambiguity (more than "
                               f"{MAX_WORK} steps): use a smaller grammar")

    def _choose(self, live: dict[Stack, int], fanout: dict[Stack, int],
                prefix: Prefix) -> tuple[int, Prefix] | None:
        """The character, among those that go on in some token, after which the most walks go on (the lowest
        code point on a tie)."""
        tops = [(chars, count * fanout[stack]) for stack, count in live.items()
                if (chars := self.top_chars(stack)) is not None]
        candidates: set[int] = set()
        for negated, ranges in {chars for chars, _ in tops}:
            if negated:
                candidates.update(probe for probe in _PROBES if not self.matches((True, ranges), probe))
                continue
            for low, high in ranges:
                if high - low < _WHOLE_RANGE:
                    candidates.update(range(low, high + 1))
                else:
                    candidates.update((low, high))
                    candidates.update(probe for probe in _PROBES if low <= probe <= high)
        self._spend(len(candidates) * (len(tops) + 1) + 1)
        best: tuple[int, Prefix] | None = None
        best_walks = 0
        for candidate in sorted(candidates):
            walks = sum(weight for chars, weight in tops if self.matches(chars, candidate))
            if walks > best_walks and (extended := self.tokens.extend(prefix, candidate)) is not None:
                best, best_walks = (candidate, extended), walks
        return best

    def matches(self, chars: CharSet, code: int) -> bool:
        known = self._matched.get((chars, code))
        if known is None:
            negated, ranges = chars
            known = self._matched[(chars, code)] = any(low <= code <= high for low, high in ranges) != negated
        return known

    def walk(self, rule: int, starts: list[Stack], origin: tuple[int, int]) -> None:
        """Follows the walks from `starts` (made at item `index` of rule `origin`) along the worst characters;
        refuses past MAX_PATHS. A walk that has left the item after `index` with no walk counted twice stops: what
        comes next is walked from the starts further on."""
        self.current = self.names[rule]
        origin_rule, index = origin
        bottom = self.stacks.bottom
        live: dict[Stack, int] = {}
        for start in starts:
            for stack in self.advance(start):
                if stack:
                    live[stack] = 1
        prefix = self.tokens.start()
        while True:
            fanout = {stack: sum(1 for s in self.advance(self.after(stack)) if s) for stack in live
                      if self.top_chars(stack) is not None}
            chosen = self._choose(live, fanout, prefix)
            if chosen is None:
                return  # no stack takes a character that goes on in a token
            char, prefix = chosen
            following: dict[Stack, int] = {}
            for stack, count in live.items():
                chars = self.top_chars(stack)
                if chars is None or not self.matches(chars, char):
                    continue
                for target in self.advance(self.after(stack)):
                    if target:
                        following[target] = following.get(target, 0) + count
            self._spend(len(live))
            walks = sum(following.values())
            if walks > MAX_PATHS:
                raise GrammarError(
                    f"grammar rule '{self.names[rule]}' is ambiguous: the text of a token (ending in {chr(char)!r}) "
                    f"can be split between its alternatives or repetitions in more than {MAX_PATHS} ways, and "
                    "llama.cpp walks every way for every candidate token: make each text match one way")
            if not following or following == live:
                return  # nothing goes on, or the same stacks again: every further step would be this one
            if walks == len(following) and all(bottom[stack][0] != origin_rule or bottom[stack][2] > index + 1
                                               for stack in following):
                return
            live = following


def _without_empty_rules(grammar: Grammar) -> list[list[list[Item]]]:
    """The rules' alternatives without references to rules that match only the empty text: llama.cpp steps through
    them to the same stacks (a 1 000 × 1 000 of them is within the bounds, and would take a million steps here)."""
    rules = grammar.rules
    users: list[list[int]] = [[] for _ in rules]
    writes = [False] * len(rules)  # can match a character
    for index, rule in enumerate(rules):
        for alternative in rule.alternatives:
            for item in alternative:
                inner = item.item if isinstance(item, Repeat) else item
                if isinstance(inner, Ref):
                    users[inner.rule].append(index)
                elif inner.length:
                    writes[index] = True
    pending = [index for index, wrote in enumerate(writes) if wrote]
    while pending:  # a rule that uses one that writes, writes
        for user in users[pending.pop()]:
            if not writes[user]:
                writes[user] = True
                pending.append(user)

    def kept(item: Item) -> bool:
        inner = item.item if isinstance(item, Repeat) else item
        return not isinstance(inner, Ref) or writes[inner.rule]

    return [[[item for item in alternative if kept(item)] for alternative in rule.alternatives] for rule in rules]


def check_ambiguity(grammar: Grammar, tokens: TokenTexts) -> int:
    """Refuses (GrammarError naming the rule) a grammar in which llama.cpp would walk more than MAX_PATHS ways
    through the tokens of `tokens`; the steps it took. The grammar must have passed `bounds.measure`."""
    walker = _Walker(grammar, tokens)
    references = [0] * len(walker.rules)
    for alternatives in walker.rules:
        for sequence in alternatives:
            for item in sequence:
                inner = item.item if isinstance(item, Repeat) else item
                if isinstance(inner, Ref):
                    references[inner.rule] += 1
    push = walker.stacks.push
    # Rules written later first (those that others use, mostly), so that the refusal names the innermost rule.
    for rule in reversed(range(len(walker.rules))):
        alternatives = walker.rules[rule]
        # A rule used in one place (a group, a chain of rules) is walked from that place, its caller's entry or
        # the start at that reference below: walking it again from its own entry finds nothing more.
        if references[rule] != 1:
            walker.walk(rule, [push(0, walker.frame(rule, number, 0)) if sequence else 0
                               for number, sequence in enumerate(alternatives)], (rule, 0))
        for number, sequence in enumerate(alternatives):
            for index in range(1, len(sequence)):
                item = sequence[index]
                inner = item.item if isinstance(item, Repeat) else item
                if isinstance(inner, Ref):  # named after the rule it enters (a group: after its own rule)
                    walker.walk(inner.rule, [push(0, walker.frame(rule, number, index))], (rule, index))
                elif isinstance(item, Repeat):
                    walker.walk(rule, [push(0, walker.frame(rule, number, index))], (rule, index))
    logger.debug("ambiguity check: %d steps", walker.work)
    return walker.work
