"""Bounds on the grammars and JSON schemas that requests bring, checked before llama.cpp sees them; the cache of
compiled grammars.

Pure Python (the grammar compiler itself is in `runner`, the only module importing llama_cpp).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from edge_llm.engine.gbnf.bounds import GrammarCost, measure
from edge_llm.engine.gbnf.errors import GrammarError
from edge_llm.engine.gbnf.syntax import parse_gbnf

__all__ = ["CompiledGrammars", "GrammarError", "check_grammar_limits", "check_schema_limits"]


# Grammars come from request bodies. llama.cpp's grammar parser recurses once per nesting level (a deep one
# overflows the C stack and kills the process) and sampling costs about (parse stacks × vocabulary) per token on
# the engine thread: every grammar is read and measured here (engine/gbnf) before llama.cpp sees it.
MAX_GRAMMAR_CHARS = 256 * 1024


def check_grammar_limits(grammar: str) -> GrammarCost:
    """Refuses (GrammarError) a grammar llama.cpp would fail on, crash on, or that would stall the engine."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is too large ({len(grammar)} characters; at most {MAX_GRAMMAR_CHARS})")
    return measure(parse_gbnf(grammar))


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


Handle = TypeVar("Handle")


class CompiledGrammars(Generic[Handle]):
    """Compiled grammars by their text (least recently used dropped first), so that the engine thread clones one
    (llama_sampler_clone: a copy of the rules and stacks, tens of microseconds) instead of compiling it (parsing
    the GBNF: up to milliseconds for a large schema) while every running sequence waits for its step.

    `add` compiles on the tokenizer thread, where every grammar is checked before the engine sees it; `instance`
    gives the engine thread a fresh copy to sample with and free. The cached originals are never sampled with,
    so no token is ever accepted into them. Compiling and freeing are the caller's functions (the runner's
    llama.cpp calls): this module stays pure Python.
    """

    def __init__(self, compile: Callable[[str], Handle | None], clone: Callable[[Handle], Handle],
                 free: Callable[[Handle], None], *, max_entries: int = 32, max_chars: int = 1024 * 1024) -> None:
        self._compile, self._clone, self._free = compile, clone, free
        self._max_entries, self._max_chars = max_entries, max_chars
        self._entries: OrderedDict[str, Handle] = OrderedDict()
        self._chars = 0
        self._closed = False
        # Held while cloning too: a handle is never freed (evicted by the other thread) while it is copied.
        self._lock = threading.Lock()

    def add(self, grammar: str) -> bool:
        """Compiles `grammar` and keeps it; False when llama.cpp rejects it."""
        with self._lock:
            if grammar in self._entries:
                self._entries.move_to_end(grammar)
                return True
        handle = self._compile(grammar)  # outside the lock: the engine thread's clones never wait for a compile
        if handle is None:
            return False
        self._keep(grammar, handle)
        return True

    def instance(self, grammar: str) -> Handle | None:
        """A compiled copy of `grammar` for one sequence (the caller frees it); compiled here, and kept, if the
        grammar is not cached (evicted since it was checked); None when llama.cpp rejects it."""
        with self._lock:
            cached = self._entries.get(grammar)
            if cached is not None:
                self._entries.move_to_end(grammar)
                return self._clone(cached)
        handle = self._compile(grammar)
        if handle is None:
            return None
        copy = self._clone(handle)
        self._keep(grammar, handle)
        return copy

    def _keep(self, grammar: str, handle: Handle) -> None:
        dropped = []
        with self._lock:
            if self._closed or grammar in self._entries or len(grammar) > self._max_chars:
                dropped.append(handle)  # closed, added meanwhile by the other thread, or too large to keep
            else:
                self._entries[grammar] = handle
                self._chars += len(grammar)
                while len(self._entries) > self._max_entries or self._chars > self._max_chars:
                    text, old = self._entries.popitem(last=False)
                    self._chars -= len(text)
                    dropped.append(old)
            for old in dropped:  # under the lock: the engine thread may be about to clone an evicted one
                self._free(old)

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for handle in self._entries.values():
                self._free(handle)
            self._entries.clear()
            self._chars = 0
