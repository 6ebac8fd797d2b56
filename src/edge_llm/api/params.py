"""Unknown request fields: ignored and reported, as llama-server, vLLM and Ollama do (`--strict-params` refuses
them with a 400 instead).

Clients written for other servers send fields this one does not know (llama-server's `id_slot`, `samplers`,
vLLM's `use_beam_search`, …). A top-level unknown field is dropped before validation, logged, and named in the
`X-Edge-LLM-Ignored-Fields` response header; the request middleware adds the header from the list this module
keeps for the request in flight. Nested objects (messages, tools) stay strict: an unknown key there is a
malformed body, not another server's option.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

logger = logging.getLogger(__name__)

IGNORED_FIELDS_HEADER = "x-edge-llm-ignored-fields"
_ignored: ContextVar[list[str] | None] = ContextVar("edge_llm_ignored_fields", default=None)


def track_ignored_fields() -> list[str]:
    """A fresh list for the request starting in this context (the middleware calls this)."""
    fields: list[str] = []
    _ignored.set(fields)
    return fields


def ignored_fields_header(fields: list[str]) -> bytes:
    """The header's value: the names joined by commas, each percent-encoded (UTF-8) except for letters, digits and
    `_.-~`. A field name is anything JSON allows (control characters, commas, any Unicode), and a header value must
    be visible ASCII: a raw one made the HTTP layer drop the whole response."""
    return ",".join(quote(name, safe="") for name in fields).encode("ascii")


def known_fields(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return names


def drop_unknown(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """`body` without the top-level fields `model` does not know; those are logged and reported."""
    known = known_fields(model)
    unknown = sorted(key for key in body if key not in known)
    if not unknown:
        return body
    logger.warning("ignored request fields: %s (--strict-params refuses them)", ", ".join(unknown))
    fields = _ignored.get()
    if fields is not None:
        fields.extend(name for name in unknown if name not in fields)
    return {key: value for key, value in body.items() if key in known}
