"""Builds the corpus' requests of the frameworks (litellm, llama-index) with the real, pinned packages
(tests/fixtures/clients/README.md):

    PYTHONPATH=src .venv/bin/python tests/tools/build_framework_fixtures.py

These frameworks make their HTTP requests through clients of their own (litellm's handlers, the ollama package),
so instead of a mock transport they are pointed at a recording HTTP server on loopback: it keeps each request and
answers with a canned reply in the protocol's own shape (OpenAI's, Anthropic's, Ollama's), so the frameworks build
their assistant turns from answers as real services return them. A request it should not answer (a stream, the
second turn) gets a 500, which ends the call once the request is recorded.
"""

from __future__ import annotations

import importlib.metadata
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.tools.build_client_fixtures import (ANTHROPIC_TOOL_USE_ANSWER, MODEL, OLLAMA_TOOL_CALL_ANSWER,
                                               OPENAI_TOOL_CALL_ANSWER, WEATHER_TOOL, quietly, write_record)


class Recorded:
    """One request as the recording server received it (the fields `write_record` reads)."""

    def __init__(self, method: str, target: str, headers: dict[str, str], content: bytes) -> None:
        parts = urlsplit(target)
        self.method, self.path, self.query = method, parts.path, parts.query
        self.headers, self.content = headers, content


class RecordingServer:
    """A loopback HTTP server that keeps every request and answers with `answer` (a 500 when None)."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.answer: dict[str, Any] | None = None
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                content = self.rfile.read(int(self.headers.get("content-length", "0")))
                recorder.requests.append(Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()},
                                                  content))
                status, body = (200, recorder.answer) if recorder.answer is not None else (
                    500, {"error": {"message": "recorded", "type": "server_error"}})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[RecordingServer]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()

    def last(self) -> Recorded:
        return self.requests[-1]


def record(client: str, call: str, library: str, how: str, server: RecordingServer) -> None:
    request = server.last()
    write_record(client, call, library, importlib.metadata.version(library),
                 f"tests/tools/build_framework_fixtures.py: {how}", request.method, request.path, request.query,
                 request.headers, request.content)


def litellm_calls(server: RecordingServer) -> None:
    """Through litellm's openai, anthropic and ollama_chat providers: chat with tools streamed, and a tool-call
    answer's message object sent back as litellm returned it, then the tool's result."""
    import litellm

    messages: list[Any] = [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": "Weather in Paris?"}]
    providers = {
        "openai": ({"model": f"openai/{MODEL}", "api_base": server.url + "/v1"}, OPENAI_TOOL_CALL_ANSWER),
        "anthropic": ({"model": f"anthropic/{MODEL}", "api_base": server.url, "max_tokens": 256},
                      ANTHROPIC_TOOL_USE_ANSWER),
        "ollama_chat": ({"model": f"ollama_chat/{MODEL}", "api_base": server.url}, OLLAMA_TOOL_CALL_ANSWER),
    }
    for name, (target, answer) in providers.items():
        def call(conversation: list[Any], stream: bool = False) -> Any:
            return litellm.completion(**target, messages=conversation, tools=[WEATHER_TOOL], stream=stream,
                                      num_retries=0, api_key="unused")

        server.answer = None
        quietly(lambda: call(messages, stream=True))
        record("litellm", f"{name}_tools_stream", "litellm",
               f"litellm.completion(model='{name}/...', tools=[...], stream=True)", server)
        server.answer = answer
        first = call(messages)
        server.answer = None
        message = first.choices[0].message
        echoed = [*messages, message, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C"}]
        quietly(lambda: call(echoed))
        record("litellm", f"{name}_assistant_echo", "litellm",
               f"litellm.completion(model='{name}/...'): the returned message object (with its tool_calls) appended "
               "to messages as returned, then the tool result", server)


def llama_index_calls(server: RecordingServer) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.ollama import Ollama

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "18 C"

    tool = FunctionTool.from_defaults(fn=get_weather)
    llm = Ollama(model=MODEL, base_url=server.url, request_timeout=30, temperature=0, context_window=8192)
    history = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="Weather in Paris?")]
    server.answer = None
    quietly(lambda: llm.stream_chat_with_tools([tool], chat_history=history))
    record("llama-index", "ollama_tools_stream", "llama-index-llms-ollama",
           "Ollama(...).stream_chat_with_tools([FunctionTool], chat_history=[...])", server)
    server.answer = OLLAMA_TOOL_CALL_ANSWER
    first = llm.chat_with_tools([tool], chat_history=history)
    server.answer = None
    calls = llm.get_tool_calls_from_response(first, error_on_no_tool_call=True)
    echoed = [*history, first.message,
              ChatMessage(role="tool", content="18 C", additional_kwargs={"tool_call_id": calls[0].tool_id,
                                                                          "name": calls[0].tool_name})]
    quietly(lambda: llm.chat_with_tools([tool], chat_history=echoed))
    record("llama-index", "ollama_tool_result", "llama-index-llms-ollama",
           "Ollama(...).chat_with_tools: the answer's ChatMessage (with its tool_calls) sent back, then a tool "
           "ChatMessage", server)


if __name__ == "__main__":
    with RecordingServer().running() as recording:
        litellm_calls(recording)
        llama_index_calls(recording)
