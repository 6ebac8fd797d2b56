"""What every family's bodies share: the base of every request body and of every object inside one, the refusal of
what a text model cannot read, the server's sampling defaults that fill what a body leaves out.

Clients written for other servers, SDKs and frameworks add keys this server does not know, at any depth (an
assistant message echoed back with `annotations` and `refusal`, a content part with `cache_control`, llama.vscode's
`input_extra` chunks with `time`). Such keys are kept aside while the body is validated (`extra="allow"`), then
reported with their dotted paths and dropped (`api/params.py`); `--strict-params` refuses them instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

# Stop strings as many as clients send (Continue sends a dozen for FIM), not OpenAI's 4; each is matched per token.
MAX_STOP_STRINGS = 64

TEXT_ONLY = "this model reads text only (no image, audio, video, document or file input)"


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="allow")


def unreadable(what: str) -> ValueError:
    """The one refusal of a part a text model cannot read (`what`: how the family names it)."""
    return ValueError(f"{what} cannot be read: {TEXT_ONLY}")


class UnreadablePart(RequestModel):
    """An image, audio, video, file or document part: known by its `type`, and refused with the reason. A family
    names its parts in `label` ("content parts of type '{kind}'", "{kind} blocks")."""

    label: ClassVar[str] = "content parts of type '{kind}'"

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        raise unreadable(cls.label.format(kind=kind))


class SamplingDefaults(BaseModel):
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int


def set_aside(body: dict[str, Any], key: str, unserved: Callable[[Any], bool]) -> list[str]:
    """Takes the entries of the raw body's list `key` that `unserved` picks out of it and returns their paths
    (`key.index`), to be reported as ignored (entries a client may well send that this server has no use for)."""
    entries = body.get(key)
    if not isinstance(entries, list):
        return []
    ignored, kept = [], []
    for index, entry in enumerate(entries):
        if unserved(entry):
            ignored.append(f"{key}.{index}")
        else:
            kept.append(entry)
    body[key] = kept
    return ignored
