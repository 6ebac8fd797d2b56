"""Which loaded models to unload so that one more fits (pure): least recently used idle ones first; a model with
work in flight, one loading or unloading, and a pinned one are never chosen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    """A model that holds memory now (loaded, loading or being unloaded)."""

    name: str
    memory_bytes: int
    evictable: bool  # loaded, no work in flight, not pinned
    last_used: float  # monotonic time of its last request's end (or of its load)


@dataclass(frozen=True)
class Room:
    fits: bool
    victims: tuple[str, ...] = ()  # to unload first, least recently used first (when it fits)
    holders: tuple[str, ...] = ()  # the models holding the memory (when it does not fit now)


def make_room(need: int, residents: Sequence[Resident], *, budget: int | None, max_loaded: int | None) -> Room:
    """The models to unload so that a model needing `need` bytes fits beside the others, within the budget and the
    count limit; or that it cannot fit now, and who holds the memory."""
    used = sum(r.memory_bytes for r in residents)
    count = len(residents)
    candidates = sorted((r for r in residents if r.evictable), key=lambda r: r.last_used)
    victims: list[str] = []

    def too_much() -> bool:
        return (budget is not None and used + need > budget) or (max_loaded is not None and count + 1 > max_loaded)

    while too_much():
        if not candidates:
            return Room(False, holders=tuple(r.name for r in residents))
        victim = candidates.pop(0)
        victims.append(victim.name)
        used -= victim.memory_bytes
        count -= 1
    return Room(True, victims=tuple(victims))
