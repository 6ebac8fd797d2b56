"""Ambiguity that multiplies inside one token, bounded before llama.cpp gets the grammar.

Before sampling, llama.cpp checks every candidate token of the vocabulary against every grammar stack
(`llama_grammar_reject_candidates_for_stack`): it matches the token's first character, advances the stack
(`llama_grammar_advance_stack`, which keeps one copy of identical stacks), and recurses into each resulting stack
for the rest of the token. Nothing is shared between the branches of that recursion, so a token whose characters
can be split between the grammar's alternatives in many ways is walked once per way: `root ::= (" " | " ")*`
gives 2^n walks for a token of n spaces (Qwen's vocabulary has tokens of up to 128 of them), one candidate holds
the engine thread for minutes, and nothing can interrupt a llama.cpp call.

This module counts those walks as llama.cpp would make them: stacks of frames (rule, alternative, item, repetitions
done, character), advanced with llama.cpp's rules (a rule that ends a sequence is not kept on the stack; identical
stacks out of one advance are kept once), each with the number of walks that reach it. From every place a stack
can start (each rule's entry, each reference or repetition inside an alternative) it follows, character by
character, the one that the most walks can take next among those that go on in a token of the vocabulary
(`tokens.TokenTexts`: walks end where the token ends), and refuses the grammar (naming the rule) once the walks
pass `MAX_PATHS`. The work is bounded (`MAX_WORK`); a grammar that needs more is refused as
too costly to check. Follows `bounds.measure`, which refuses what would make an advance endless (left recursion,
repetitions of what can match nothing).
"""

from __future__ import annotations

import logging

from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import CharSet, Grammar, Item, Ref, Repeat, Terminal
from edge_llm.engine.grammar.gbnf.tokens import Prefix, TokenTexts

logger = logging.getLogger(__name__)

MAX_PATHS = 100_000  # walks of one candidate token through the grammar's stacks
MAX_WORK = 1_000_000  # stack advances, matches and character choices over the whole check

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
        self._sets: list[CharSet] = []
        self._set_numbers: dict[CharSet, int] = {}
        self._top_sets: dict[Stack, int] = {}
        self._groups: dict[tuple[int, ...], list[tuple[tuple[int, ...], list[int]]]] = {}
        self._going_on: dict[tuple[Prefix, tuple[int, ...], int], tuple[int, Prefix] | None] = {}
        self._following: dict[Stack, tuple[Stack, ...]] = {}
        self._taken: dict[tuple[int, int], bool] = {}

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
        weights: dict[int, int] = {}  # walks by the character set on top (interned)
        top_set = self._top_set
        for stack, count in live.items():
            chars = top_set(stack)
            if chars >= 0:
                weights[chars] = weights.get(chars, 0) + count * fanout[stack]
        if not weights:
            return None
        sets = tuple(weights)
        groups = self._groups.get(sets)
        if groups is None:
            groups = self._groups[sets] = self._group_candidates(sets)
        # The walks after each group of characters (those matched by the same sets), most first; in the first
        # group (or groups, on a tie) with a character that goes on in a token, the lowest such character wins.
        ranked: dict[int, list[int]] = {}
        for position, (matched, _) in enumerate(groups):
            walks = sum(weights[sets[index]] for index in matched)
            if walks:
                ranked.setdefault(walks, []).append(position)
        self._spend(len(groups) + 1)
        for walks in sorted(ranked, reverse=True):
            found = [chosen for position in ranked[walks]
                     if (chosen := self._first_going_on(prefix, sets, position, groups[position][1])) is not None]
            if found:
                return min(found)
        return None

    def _first_going_on(self, prefix: Prefix, sets: tuple[int, ...], position: int,
                        codes: list[int]) -> tuple[int, Prefix] | None:
        """The lowest of `codes` (group `position` of the candidates for `sets`) that goes on in a token after
        `prefix`, with the prefix it makes; once per check."""
        key = (prefix, sets, position)
        if key in self._going_on:
            return self._going_on[key]
        found = None
        for code in codes:
            self._spend(1)
            extended = self.tokens.extend(prefix, code)
            if extended is not None:
                found = (code, extended)
                break
        self._going_on[key] = found
        return found

    def _group_candidates(self, sets: tuple[int, ...]) -> list[tuple[tuple[int, ...], list[int]]]:
        """The characters worth trying against the character sets `sets` (a narrow range whole, the ends and the
        probes of a wide one, the probes outside a negated one), grouped by the sets that match them."""
        candidates: set[int] = set()
        for negated, ranges in (self._sets[index] for index in sets):
            if negated:
                candidates.update(probe for probe in _PROBES if not _inside(ranges, probe))
                continue
            for low, high in ranges:
                if high - low < _WHOLE_RANGE:
                    candidates.update(range(low, high + 1))
                else:
                    candidates.update((low, high))
                    candidates.update(probe for probe in _PROBES if low <= probe <= high)
        self._spend(len(candidates) * len(sets) + 1)
        groups: dict[tuple[int, ...], list[int]] = {}
        for code in candidates:
            matched = tuple(position for position, index in enumerate(sets)
                            if _inside(self._sets[index][1], code) != self._sets[index][0])
            groups.setdefault(matched, []).append(code)
        return [(matched, sorted(codes)) for matched, codes in groups.items()]

    def _top_set(self, stack: Stack) -> int:
        """The interned character set on top of `stack`; -1 for a token."""
        known = self._top_sets.get(stack)
        if known is None:
            chars = self.top_chars(stack)
            if chars is None:
                known = -1
            else:
                known = self._set_numbers.get(chars)
                if known is None:
                    known = self._set_numbers[chars] = len(self._sets)
                    self._sets.append(chars)
            self._top_sets[stack] = known
        return known

    def _successors(self, stack: Stack) -> tuple[Stack, ...]:
        """The stacks a stack with a character on top goes on as once it is matched (not the empty one)."""
        known = self._following.get(stack)
        if known is None:
            known = self._following[stack] = tuple(target for target in self.advance(self.after(stack)) if target)
        return known

    def _takes(self, chars: int, code: int) -> bool:
        known = self._taken.get((chars, code))
        if known is None:
            negated, ranges = self._sets[chars]
            known = self._taken[(chars, code)] = _inside(ranges, code) != negated
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
        successors, top_set = self._successors, self._top_set
        while True:
            fanout = {stack: len(successors(stack)) for stack in live if top_set(stack) >= 0}
            chosen = self._choose(live, fanout, prefix)
            if chosen is None:
                return  # no stack takes a character that goes on in a token
            char, prefix = chosen
            following: dict[Stack, int] = {}
            for stack in fanout:
                if not self._takes(top_set(stack), char):
                    continue
                count = live[stack]
                for target in successors(stack):
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


def _inside(ranges: tuple[tuple[int, int], ...], code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


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


def _shape(item: Item) -> object:  # what a walk sees of `item` (a terminal's equality leaves out its characters)
    if isinstance(item, Repeat):
        return (_shape(item.item), item.min, item.max)
    return item.rule if isinstance(item, Ref) else (item.length, item.chars)


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
    # A walk sees only the items from its start on (a start frame has nothing below it), so the walk from a place
    # whose items are those of a place already walked (each property of a schema: `space ":" space string`) is the
    # same walk and passes again: each shape is walked once, and the check grows with the grammar's distinct shapes.
    walked: set[object] = set()
    suffixes: dict[tuple[object, int], int] = {}  # (an item's shape, the suffix after it): a number, from the end
    # Rules written later first (those that others use, mostly), so that the refusal names the innermost rule.
    for rule in reversed(range(len(walker.rules))):
        alternatives = walker.rules[rule]
        # A rule used in one place (a group, a chain of rules) is walked from that place, its caller's entry or
        # the start at that reference below: walking it again from its own entry finds nothing more.
        entry = tuple(tuple(map(_shape, sequence)) for sequence in alternatives)
        if references[rule] != 1 and entry not in walked:
            walked.add(entry)
            walker.walk(rule, [push(0, walker.frame(rule, number, 0)) if sequence else 0
                               for number, sequence in enumerate(alternatives)], (rule, 0))
        for number, sequence in enumerate(alternatives):
            after = [0] * (len(sequence) + 1)
            for index in reversed(range(len(sequence))):
                key = (_shape(sequence[index]), after[index + 1])
                after[index] = suffixes.setdefault(key, len(suffixes) + 1)
            for index in range(1, len(sequence)):
                if after[index] in walked:
                    continue
                walked.add(after[index])
                item = sequence[index]
                inner = item.item if isinstance(item, Repeat) else item
                if isinstance(inner, Ref):  # named after the rule it enters (a group: after its own rule)
                    walker.walk(inner.rule, [push(0, walker.frame(rule, number, index))], (rule, index))
                elif isinstance(item, Repeat):
                    walker.walk(rule, [push(0, walker.frame(rule, number, index))], (rule, index))
    logger.debug("ambiguity check: %d steps", walker.work)
    return walker.work
