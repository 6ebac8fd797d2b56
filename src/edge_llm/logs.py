"""Logging set-up: JSON lines (default) or text, and the request id on every line about a request.

What a line is about (its `LogSubject`: the request's context, whose id and model it names) is bound to the
current context by the request middleware (`bind_subject`); a handler filter copies its id (and its model, with
several models served) onto each record. This is the one fact kept in a ContextVar, and only for log records:
lines are logged by code that is never handed the request (uvicorn, Starlette, the libraries, helpers deep in a
call), and a ContextVar follows the request's task and what it awaits. Serving code gets the context passed
explicitly (api/request_context.py). Code outside the request's context (the engine thread) passes
`extra={"request_id": ...}`; an engine thread binds the model it runs (`bind_model`).
Extra fields given with `extra=` become JSON keys (or `key=value` pairs in text mode).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar, Token
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol, TextIO


class LogSubject(Protocol):
    """What log lines are about: a request (its id; its model when several are served) or an engine thread."""

    @property
    def id(self) -> str | None: ...

    @property
    def model(self) -> str | None: ...


@dataclass(frozen=True)
class ModelThread:
    """An engine thread's lines name its model and no request."""

    model: str
    id: None = None


_subject: ContextVar[LogSubject | None] = ContextVar("edge_llm_log_subject", default=None)
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=-]{1,128}")  # no "/": the engine uses "<id>/<choice>" for n>1

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "request_id", "color_message",  # uvicorn's ANSI-coloured copy of the message
}


def new_request_id() -> str:
    return uuid.uuid4().hex


def sane_request_id(value: str | None) -> str | None:
    """A client's X-Request-Id when it is safe to log and echo (1–128 printable token characters)."""
    if value and _SANE_REQUEST_ID.fullmatch(value):
        return value
    return None


def current_request_id() -> str | None:
    """The id of the request this context's log lines are about (the watchdog names it when work overruns)."""
    subject = _subject.get()
    return subject.id if subject is not None else None


def bind_subject(subject: LogSubject) -> Token[LogSubject | None]:
    """Every line logged in this context (a request's task and what it awaits) is about `subject`."""
    return _subject.set(subject)


def unbind_subject(token: Token[LogSubject | None]) -> None:
    _subject.reset(token)


def bind_model(name: str) -> Token[LogSubject | None]:
    """Names the model on every log line of this engine thread."""
    return _subject.set(ModelThread(name))


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        subject = _subject.get()
        if getattr(record, "request_id", None) is None:
            record.request_id = subject.id if subject is not None else None
        model = subject.model if subject is not None else None
        if model is not None and not hasattr(record, "model"):
            record.model = model
        return True


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRIBUTES and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            line["request_id"] = request_id
        line.update(_extras(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        head, sep, tail = text.partition("\n")  # keep tracebacks after the fields
        fields = " ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in _extras(record).items())
        if request_id:
            fields = f"request_id={request_id} {fields}".rstrip()
        return f"{head} {fields}{sep}{tail}" if fields else text


_HANDLER_NAME = "edge-llm"


def configure_logging(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Installs (or replaces) the one root handler; uvicorn's loggers propagate to it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
