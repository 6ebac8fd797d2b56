"""JSON and text log lines, and the request id on every line logged while serving a request."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from edge_llm.logs import ModelThread, bind_model, bind_subject, configure_logging, sane_request_id, unbind_subject


@dataclass(frozen=True)
class Subject:
    id: str | None
    model: str | None = None


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    buffer = io.StringIO()
    yield buffer
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def test_json_lines_carry_the_request_id_and_extra_fields(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream)
    log = logging.getLogger("edge_llm.test")
    token = bind_subject(Subject("req-1"))
    try:
        log.info("hello %s", "world", extra={"status": 200, "path": "/x"})
    finally:
        unbind_subject(token)
    log.warning("outside")
    log.info("from the engine thread", extra={"request_id": "req-2"})
    log.debug("hidden")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "hello world" and first["request_id"] == "req-1"
    assert first["status"] == 200 and first["path"] == "/x"
    assert first["level"] == "info" and first["logger"] == "edge_llm.test" and first["ts"].endswith("+00:00")
    assert "request_id" not in second and second["level"] == "warning"
    assert third["request_id"] == "req-2"


def test_exceptions_stay_inside_the_json_line(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("edge_llm.test").exception("failed")
    (line,) = stream.getvalue().splitlines()
    assert "ValueError: boom" in json.loads(line)["exc"]


def test_text_lines(stream: io.StringIO) -> None:
    configure_logging("info", "text", stream)
    token = bind_subject(Subject("req-9"))
    try:
        logging.getLogger("edge_llm.test").info("GET / 200", extra={"duration_ms": 1.5})
    finally:
        unbind_subject(token)
    line = stream.getvalue().strip()
    assert "INFO edge_llm.test: GET / 200" in line and "request_id=req-9" in line and "duration_ms=1.5" in line


def test_lines_name_the_subjects_model_and_an_engine_threads_model(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream)
    log = logging.getLogger("edge_llm.test")
    token = bind_subject(Subject("req-3", "qwen"))
    try:
        log.info("served")
    finally:
        unbind_subject(token)
    token = bind_model("gemma")
    try:
        log.info("decoded")
    finally:
        unbind_subject(token)
    served, decoded = (json.loads(line) for line in stream.getvalue().splitlines())
    assert served["request_id"] == "req-3" and served["model"] == "qwen"
    assert decoded["model"] == "gemma" and "request_id" not in decoded
    assert ModelThread("gemma").id is None


def test_configure_twice_keeps_one_handler(stream: io.StringIO) -> None:
    configure_logging("info", "json", stream)
    configure_logging("info", "json", stream)
    logging.getLogger("edge_llm.test").info("once")
    assert len(stream.getvalue().splitlines()) == 1


@pytest.mark.parametrize("value", ["abc", "0f3a-11", "req_1.2:3", "a" * 128, "k=v+w@x"])
def test_sane_request_ids_are_kept(value: str) -> None:
    assert sane_request_id(value) == value


@pytest.mark.parametrize("value", [None, "", "a" * 129, "has space", "new\nline", "quote\"", "a/b", "é"])
def test_other_request_ids_are_replaced(value: str | None) -> None:
    assert sane_request_id(value) is None
