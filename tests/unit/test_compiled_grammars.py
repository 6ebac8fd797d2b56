"""The cache of compiled grammars (engine/grammar/compiled.py) with fake handles: the engine thread gets
copies, the originals are freed exactly once, and the cache stays bounded."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from edge_llm.engine.grammar.compiled import CompiledGrammars


@dataclass
class Handle:
    text: str
    original: bool
    freed: int = 0


@dataclass
class FakeLlama:
    compiled: list[Handle] = field(default_factory=list)
    clones: list[Handle] = field(default_factory=list)

    def compile(self, text: str) -> Handle | None:
        if text == "bad":
            return None
        handle = Handle(text, original=True)
        self.compiled.append(handle)
        return handle

    def clone(self, handle: Handle) -> Handle:
        assert handle.freed == 0, "cloned a freed grammar"
        copy = Handle(handle.text, original=False)
        self.clones.append(copy)
        return copy

    def free(self, handle: Handle) -> None:
        handle.freed += 1

    def cache(self, **limits: int) -> CompiledGrammars[Handle]:
        return CompiledGrammars(self.compile, self.clone, self.free, **limits)


def test_a_checked_grammar_is_cloned_not_compiled_again() -> None:
    llama = FakeLlama()
    cache = llama.cache()
    assert cache.add("root ::= x")
    first, second = cache.instance("root ::= x"), cache.instance("root ::= x")
    assert len(llama.compiled) == 1
    assert first is not second and not first.original and not second.original
    assert all(h.freed == 0 for h in llama.compiled)


def test_a_grammar_llama_cpp_rejects_is_not_kept() -> None:
    llama = FakeLlama()
    cache = llama.cache()
    assert not cache.add("bad")
    assert cache.instance("bad") is None
    assert len(cache) == 0


def test_a_grammar_not_cached_is_compiled_on_use_and_kept() -> None:
    llama = FakeLlama()
    cache = llama.cache()
    copy = cache.instance("root ::= y")
    assert copy is not None and not copy.original
    cache.instance("root ::= y")
    assert len(llama.compiled) == 1 and len(llama.clones) == 2


def test_the_least_recently_used_is_freed_once_beyond_the_entry_bound() -> None:
    llama = FakeLlama()
    cache = llama.cache(max_entries=2)
    for text in ("a", "b"):
        cache.add(text)
    cache.instance("a")  # "b" is now the least recently used
    cache.add("c")
    assert len(cache) == 2
    assert [h.text for h in llama.compiled if h.freed] == ["b"]
    assert all(h.freed <= 1 for h in llama.compiled)


def test_the_size_bound_counts_grammar_text() -> None:
    llama = FakeLlama()
    cache = llama.cache(max_chars=10)
    cache.add("x" * 6)
    cache.add("y" * 6)
    assert len(cache) == 1 and llama.compiled[0].freed == 1
    cache.add("z" * 11)  # larger than the whole cache: compiled (to check it) and freed at once
    assert llama.compiled[-1].freed == 1 and len(cache) == 1


def test_adding_twice_keeps_one_and_close_frees_every_original_once() -> None:
    llama = FakeLlama()
    cache = llama.cache()
    cache.add("a")
    cache.add("a")
    cache.add("b")
    assert len(llama.compiled) == 2
    cache.close()
    assert [h.freed for h in llama.compiled] == [1, 1]
    cache.add("c")  # after close nothing is kept
    assert llama.compiled[-1].freed == 1 and len(cache) == 0
    assert all(h.freed == 0 for h in llama.clones)  # copies belong to their samplers


def test_two_threads_never_clone_a_freed_grammar() -> None:
    llama = FakeLlama()
    cache = llama.cache(max_entries=3)
    texts = [f"g{i}" for i in range(8)]
    errors: list[BaseException] = []

    def run(action: str) -> None:
        try:
            for round_ in range(300):
                text = texts[round_ % len(texts)]
                cache.add(text) if action == "add" else cache.instance(text)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(action,)) for action in ("add", "instance")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    cache.close()
    assert all(h.freed == 1 for h in llama.compiled)
