"""The cache of compiled grammars: the engine thread clones a compiled grammar instead of compiling it.

Pure Python (the grammar compiler itself is in `llama.runner`, the only package importing llama_cpp).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

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
