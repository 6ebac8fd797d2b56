"""Model names as clients type them (pure): the one place that decides which served model a name means.

A model answers to its exact names (its id, file name, catalogue name, --model-alias, configured and copied
aliases) and to Ollama's spelling of each: `model:tag` where no tag means `:latest` (`qwen2.5-coder` is
`qwen2.5-coder:latest`), the default registry and namespace implied (`registry.ollama.ai/library/gemma3:270m` is
`gemma3:270m`), case ignored (Ollama's names are case-insensitive). A name matching no model matches nothing: an
unknown model is never swapped for another.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

DEFAULT_TAG = "latest"
_DEFAULT_PREFIXES = ("registry.ollama.ai/", "library/")  # Ollama's default host, then its default namespace

T = TypeVar("T")


def has_tag(name: str) -> bool:
    """`name:tag` (a colon after the last slash; one before it is a host's port)."""
    colon = name.rfind(":")
    return colon > name.rfind("/")


def tagged(name: str) -> str:
    """Ollama's display form: `name:latest` when the name has no tag."""
    return name if has_tag(name) else f"{name}:{DEFAULT_TAG}"


def normalized(name: str) -> str:
    """The form two names are compared in: tagged, default host and namespace dropped, case folded."""
    for prefix in _DEFAULT_PREFIXES:
        if name.lower().startswith(prefix):
            name = name[len(prefix):]
    return tagged(name).casefold()


def same_name(requested: str, names: Iterable[str]) -> bool:
    """Whether `requested` names the model called `names`."""
    key = normalized(requested)
    return any(requested == name or key == normalized(name) for name in names)


class NameTaken(ValueError):
    def __init__(self, name: str, owner: object) -> None:
        super().__init__(name)
        self.name = name
        self.owner = owner


class NameIndex(Generic[T]):
    """Names → their model: an exact name first, else its normalized form."""

    def __init__(self) -> None:
        self._exact: dict[str, T] = {}
        self._normal: dict[str, T] = {}

    def add(self, name: str, owner: T) -> None:
        """Raises NameTaken when the name (or a name spelled the same way) belongs to another model."""
        for table, key in ((self._exact, name), (self._normal, normalized(name))):
            other = table.get(key)
            if other is not None and other is not owner:
                raise NameTaken(name, other)
        self._exact[name] = owner
        self._normal[normalized(name)] = owner

    def owner(self, name: str) -> T | None:
        """The model `name` means, or None."""
        found = self._exact.get(name)
        return found if found is not None else self._normal.get(normalized(name))

    def discard(self, name: str) -> None:
        self._exact.pop(name, None)
        self._normal.pop(normalized(name), None)

    def discard_owner(self, owner: T) -> None:
        for table in (self._exact, self._normal):
            for key in [key for key, value in table.items() if value is owner]:
                del table[key]
