"""Unknown request keys: ignored and reported, as llama-server, vLLM and Ollama ignore them (`--strict-params`
refuses them with a 400 instead).

Clients written for other servers send keys this one does not know, at every depth: llama-server's `id_slot` and
`samplers`, vLLM's `use_beam_search`, an SDK's `annotations` and `refusal` on an echoed assistant message,
`cache_control` on a content part, llama.vscode's `time` on an `input_extra` chunk. Request models keep them aside
while validating (`protocol.common.RequestModel`); `take_unknown` then collects their dotted paths and drops them. The
paths are logged and kept in the request's context (api/request_context.py), from which the request middleware
names them in the `X-Edge-LLM-Ignored-Fields` response header.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from edge_llm.api.errors import APIError, from_pydantic
from edge_llm.api.request_context import RequestContext

logger = logging.getLogger(__name__)

IGNORED_FIELDS_HEADER = "x-edge-llm-ignored-fields"
MAX_REPORTED_FIELDS = 32  # in the header and the log line; a body may hold thousands of unknown keys
Body = TypeVar("Body", bound=BaseModel)


def ignored_fields_header(fields: list[str]) -> bytes:
    """The header's value: the paths joined by commas, each percent-encoded (UTF-8) except for letters, digits and
    `_.-~`, at most MAX_REPORTED_FIELDS of them (then `…+N`). A key is anything JSON allows (control characters,
    commas, any Unicode), and a header value must be visible ASCII: a raw one made the HTTP layer drop the whole
    response."""
    shown = ",".join(quote(name, safe="") for name in fields[:MAX_REPORTED_FIELDS])
    if len(fields) > MAX_REPORTED_FIELDS:
        shown += f",...+{len(fields) - MAX_REPORTED_FIELDS}"
    return shown.encode("ascii")


def take_unknown(body: BaseModel) -> list[str]:
    """The dotted paths (`messages.1.annotations`) of the keys a validated body held that its models do not know,
    at every depth; they are removed from the models, so nothing downstream sees them."""
    paths: list[str] = []
    pending: list[tuple[str, Any]] = [("", body)]
    while pending:  # iterative: a deeply nested body must not overflow the Python stack here
        prefix, value = pending.pop()
        if isinstance(value, BaseModel):
            extra = value.__pydantic_extra__
            if extra:
                paths.extend(prefix + str(key) for key in extra)
                extra.clear()
            pending.extend((f"{prefix}{name}.", getattr(value, name)) for name in type(value).model_fields)
        elif isinstance(value, (list, tuple)):
            pending.extend((f"{prefix}{index}.", item) for index, item in enumerate(value) if _holds_models(item))
        elif isinstance(value, dict):
            pending.extend((f"{prefix}{key}.", item) for key, item in value.items() if _holds_models(item))
    return sorted(paths, key=_natural)


def _holds_models(value: Any) -> bool:
    return isinstance(value, (BaseModel, list, tuple)) or (isinstance(value, dict) and bool(value))


def _natural(path: str) -> list[tuple[int, int | str]]:
    # (isdigit alone is true of "³", which int() refuses: a 500 for a body with such a key)
    return [(0, int(part)) if part.isascii() and part.isdigit() else (1, part) for part in path.split(".")]


def report_ignored(context: RequestContext, paths: list[str]) -> None:
    """Logs the ignored keys and adds them to the request's context (each once, in order), for its header."""
    if not paths:
        return
    shown = ", ".join(paths[:MAX_REPORTED_FIELDS]) + (" …" if len(paths) > MAX_REPORTED_FIELDS else "")
    logger.warning("ignored request fields: %s (--strict-params refuses them)", shown)
    fields = context.ignored_fields
    seen = set(fields)  # (a set for the test: `in` on the list made 40,000 unknown keys take 20 s, issue 41)
    fields.extend(path for path in dict.fromkeys(paths) if path not in seen)


def parse_body(context: RequestContext, model: type[Body], body: dict[str, Any], *, strict: bool) -> Body:
    """`body` validated as `model`; keys its models do not know, at any depth, are ignored and reported, or refused
    when `strict` (`--strict-params`)."""
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        raise from_pydantic(exc, body) from None
    except RecursionError:
        raise APIError(400, "The request body is nested too deeply", code="invalid_json") from None
    unknown = take_unknown(parsed)
    if unknown and strict:
        raise APIError(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0],
                       code="unknown_parameter")
    report_ignored(context, unknown)
    return parsed
