"""What a parsed grammar would cost llama.cpp, bounded before it gets it.

llama.cpp keeps one "stack" per way the text so far can continue and checks every candidate token against every
stack, so its work per step is about (stacks × vocabulary). What multiplies stacks is refused here, by rule:
- left recursion, also behind rules that can be empty (llama.cpp refuses it too, but only after its check walked
  every leftmost path: exponentially many in `a_k ::= a_(k-1) a_(k-1) | ""`);
- a repetition of something that can be empty (`("a"? | "b"?){0,40}`, `(x?)*`): every split of the empty string is
  a path;
- more stacks than a budget where a rule is entered (the doubling grammar above has 2^k of them);
- leftmost rule chains (llama.cpp recurses on both), repetition counts multiplied through nesting and the
  size once llama.cpp has written every `{m,n}` out.
All in linear passes without recursion: the grammar comes from a request.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.syntax import Grammar, Item, Ref, Repeat, Terminal

logger = logging.getLogger(__name__)

MAX_LEFT_CHAIN = 1024  # rules each starting with the next (llama.cpp's left-recursion check recurses per rule)
MAX_LEFT_PATHS = 1_000_000  # leftmost paths that check walks, over every rule
MAX_STACKS = 2048  # stacks one rule (or the rest of one alternative) can open at once
MAX_REPETITION_PRODUCT = 100_000  # `{m,n}` counts multiplied through nesting
MAX_EXPANDED_ELEMENTS = 2_000_000  # llama.cpp's rule elements once repetitions are written out

_CAP = 1 << 62  # counts saturate here: only "over the limit" matters


@dataclass(frozen=True, slots=True)
class GrammarCost:
    stacks: int  # the most stacks a rule, or the rest of an alternative, can open at once
    repetition_product: int
    expanded_elements: int


def _ref_of(item: Item) -> int | None:
    if isinstance(item, Ref):
        return item.rule
    if isinstance(item, Repeat) and isinstance(item.item, Ref):
        return item.item.rule
    return None


def _nullable_rules(grammar: Grammar) -> list[bool]:
    """Which rules can match the empty string (a worklist: linear in the grammar's size)."""
    rules = grammar.rules
    nullable = [False] * len(rules)
    waiting: list[list[tuple[int, int]]] = [[] for _ in rules]  # rule -> alternatives waiting on it
    pending: dict[tuple[int, int], int] = {}
    ready: deque[int] = deque()
    for index, rule in enumerate(rules):
        for number, alternative in enumerate(rule.alternatives):
            blockers = 0
            for item in alternative:
                if isinstance(item, Terminal) or (isinstance(item, Repeat) and item.min > 0
                                                  and isinstance(item.item, Terminal)):
                    blockers = -1
                    break
                if isinstance(item, Repeat) and item.min == 0:
                    continue
                ref = _ref_of(item)
                assert ref is not None
                waiting[ref].append((index, number))
                blockers += 1
            if blockers == 0 and not nullable[index]:
                nullable[index] = True
                ready.append(index)
            elif blockers > 0:
                pending[(index, number)] = blockers
    while ready:
        done = ready.popleft()
        for key in waiting[done]:
            if key not in pending:
                continue
            pending[key] -= 1
            if pending[key] == 0:
                del pending[key]
                if not nullable[key[0]]:
                    nullable[key[0]] = True
                    ready.append(key[0])
    return nullable


def _item_nullable(item: Item, nullable: list[bool]) -> bool:
    if isinstance(item, Terminal):
        return False
    if isinstance(item, Ref):
        return nullable[item.rule]
    return item.min == 0 or _item_nullable(item.item, nullable)


def _leftmost_order(grammar: Grammar, nullable: list[bool]) -> list[int]:
    """Rules ordered so that every rule comes after the rules it can start with; refuses left recursion."""
    rules = grammar.rules
    starts: list[list[int]] = [[] for _ in rules]
    for index, rule in enumerate(rules):
        for alternative in rule.alternatives:
            for item in alternative:
                ref = _ref_of(item)
                if ref is not None:
                    starts[index].append(ref)
                if not _item_nullable(item, nullable):
                    break
    # Kahn's algorithm on "starts with", leaves first.
    users: list[list[int]] = [[] for _ in rules]
    remaining = [len(set(targets)) for targets in starts]
    for index, targets in enumerate(starts):
        for target in set(targets):
            users[target].append(index)
    order = [index for index, count in enumerate(remaining) if count == 0]
    for done in order:  # grows while iterating
        for user in users[done]:
            remaining[user] -= 1
            if remaining[user] == 0:
                order.append(user)
    if len(order) < len(rules):
        cyclic = next(index for index, count in enumerate(remaining) if count)
        raise GrammarError(f"grammar rule '{rules[cyclic].name}' is left-recursive (it can start with itself, "
                           "maybe behind rules that match nothing): llama.cpp cannot use it")
    chain = [0] * len(rules)
    paths = [0] * len(rules)
    total_paths = 0
    for index in order:
        chain[index] = 1 + max((chain[t] for t in starts[index]), default=0)
        paths[index] = min(_CAP, 1 + sum(paths[t] for t in starts[index]))
        total_paths = min(_CAP, total_paths + paths[index])
        if chain[index] > MAX_LEFT_CHAIN:
            raise GrammarError(f"grammar rule '{rules[index].name}' starts a chain of {chain[index]} rules each "
                               f"starting with the next (at most {MAX_LEFT_CHAIN})")
    if total_paths > MAX_LEFT_PATHS:
        worst = max(order, key=lambda index: paths[index])
        raise GrammarError(f"grammar rule '{rules[worst].name}' can start in too many ways ({paths[worst]} leftmost "
                           f"paths; at most {MAX_LEFT_PATHS} in all): make alternatives that match nothing explicit")
    return order


def _check_repetitions(grammar: Grammar, nullable: list[bool]) -> None:
    for rule in grammar.rules:
        for alternative in rule.alternatives:
            for item in alternative:
                if (isinstance(item, Repeat) and (item.max is None or item.max > 1)
                        and _item_nullable(item.item, nullable)):
                    raise GrammarError(f"grammar rule '{rule.name}' repeats something that can match nothing: "
                                       "every way of splitting the text between the repetitions is a path "
                                       "(make the repeated part non-empty)")


def _count_stacks(grammar: Grammar, nullable: list[bool], order: list[int]) -> int:
    """The stacks each rule opens when entered (llama.cpp's advance: one per terminal reachable at its start,
    through every rule that can match nothing), and the most that the rest of any alternative opens."""
    rules = grammar.rules
    opened = [0] * len(rules)

    def of(item: Item) -> int:
        if isinstance(item, Terminal):
            return 1
        if isinstance(item, Ref):
            return opened[item.rule]
        return of(item.item)

    def rests(alternative: list[Item]) -> list[int]:
        """The stacks opened from each position to the end of the alternative, right to left."""
        found, rest = [], 0
        for item in reversed(alternative):
            rest = min(_CAP, of(item) + (rest if _item_nullable(item, nullable) else 0))
            found.append(rest)
        return found

    def multiplied(index: int) -> GrammarError:
        return GrammarError(f"grammar rule '{rules[index].name}' opens more than {MAX_STACKS} parse stacks at once "
                            "(alternatives that can match nothing multiply them): llama.cpp would check every token "
                            "against each")

    for index in order:  # what a rule opens where it is entered needs only the rules it can start with
        total = 0
        for alternative in rules[index].alternatives:
            at_start = rests(alternative)[-1] if alternative else 0
            if at_start > MAX_STACKS:
                raise multiplied(index)
            total = min(_CAP, total + at_start)
        opened[index] = total
        if total > MAX_STACKS:
            raise GrammarError(f"grammar rule '{rules[index].name}' opens {total} parse stacks at once (at most "
                               f"{MAX_STACKS}): use fewer alternatives, or fewer that can match nothing")
    # The rest of an alternative after its first item also counts the rules it reaches there, which `order` can put
    # after it: only now is every rule's count known.
    worst = max(opened, default=0)
    for index in order:
        for alternative in rules[index].alternatives:
            most = max(rests(alternative), default=0)
            if most > MAX_STACKS:
                raise multiplied(index)
            worst = max(worst, most)
    return worst


def _count_expansion(grammar: Grammar, root: int) -> tuple[int, int]:
    """The product of repetition counts through nesting (reachable from root, back edges of recursion left out)
    and the elements llama.cpp writes once every repetition is expanded."""
    rules = grammar.rules

    def size(item: Item) -> int:
        if isinstance(item, Terminal):
            return item.length
        if isinstance(item, Ref):
            return 1
        inner = size(item.item)
        optional = 1 if item.max is None else item.max - item.min
        return inner * max(item.min, 1) + optional * (inner + 2)

    elements = sum(size(item) + 1 for rule in rules for alternative in rule.alternatives for item in alternative)
    if elements > MAX_EXPANDED_ELEMENTS:
        raise GrammarError(f"the grammar expands to {elements} elements once its repetitions are written out (at most "
                           f"{MAX_EXPANDED_ELEMENTS}): use smaller counts")
    product = [1] * len(rules)
    state = [0] * len(rules)  # 0 new, 1 open, 2 done
    stack: list[tuple[int, int]] = [(root, 0)]
    children: list[list[tuple[int, int]]] = [[] for _ in rules]
    for index, rule in enumerate(rules):
        for alternative in rule.alternatives:
            for item in alternative:
                count = item.max if isinstance(item, Repeat) and item.max is not None else 1
                ref = _ref_of(item)
                if ref is not None:
                    children[index].append((ref, max(count, 1)))
                else:
                    product[index] = max(product[index], count)  # a repeated terminal: the innermost count
    state[root] = 1
    while stack:  # iterative depth-first search; a product is final when its rule closes
        index, next_child = stack[-1]
        if next_child < len(children[index]):
            stack[-1] = (index, next_child + 1)
            child, _ = children[index][next_child]
            if state[child] == 0:
                state[child] = 1
                stack.append((child, 0))
            continue
        stack.pop()
        state[index] = 2
        best = product[index]
        for child, count in children[index]:
            if state[child] == 2:  # an open child is a recursion: its counts do not nest further here
                best = max(best, min(_CAP, count * product[child]))
        product[index] = best
        if best > MAX_REPETITION_PRODUCT:
            raise GrammarError(f"grammar rule '{rules[index].name}' nests repetitions whose counts multiply to "
                               f"{best} (at most {MAX_REPETITION_PRODUCT})")
    return product[root], elements


def measure(grammar: Grammar, root: str = "root") -> GrammarCost:
    """Refuses (GrammarError, naming the rule) a grammar whose cost llama.cpp could not bound."""
    root_index = grammar.rule_named(root)
    if root_index is None:
        raise GrammarError(f"the grammar has no '{root}' rule")
    product, elements = _count_expansion(grammar, root_index)
    nullable = _nullable_rules(grammar)
    _check_repetitions(grammar, nullable)
    order = _leftmost_order(grammar, nullable)
    stacks = _count_stacks(grammar, nullable, order)
    return GrammarCost(stacks, product, elements)
