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


_HOST_MAX, _PART_MAX = 350, 80


def valid_ollama_name(name: str) -> bool:
    """Whether Ollama would take `name` as a model's name ([host/][namespace/]model[:tag], its types/model/name.go):
    each part starts with a letter, digit or `_` and goes on with those, `-`, `_` and `.` (no `.` in a namespace;
    `:` only in a host, for its port); 80 characters at most (350 for a host)."""
    rest, tag = (name.rsplit(":", 1) if has_tag(name) else (name, DEFAULT_TAG))
    scheme, separator, after = rest.partition("://")
    parts = (after if separator else scheme).split("/")
    if len(parts) > 3 or (separator and len(parts) < 3):
        return False
    kinds = ("host", "namespace", "model")[3 - len(parts):]
    return _valid_part(tag, "tag") and all(_valid_part(part, kind) for part, kind in zip(parts, kinds))


def _valid_part(part: str, kind: str) -> bool:
    if not part or len(part) > (_HOST_MAX if kind == "host" else _PART_MAX):
        return False
    if not (part[0].isascii() and (part[0].isalnum() or part[0] == "_")):
        return False
    allowed = "_-" + ("" if kind == "namespace" else ".") + (":" if kind == "host" else "")
    return all(char.isascii() and (char.isalnum() or char in allowed) for char in part[1:])


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
