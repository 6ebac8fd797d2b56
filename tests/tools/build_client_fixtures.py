"""Builds the corpus' library-built requests with the real, pinned libraries (tests/fixtures/clients/README.md):

    PYTHONPATH=src .venv/bin/python tests/tools/build_client_fixtures.py

Each library is driven as an application drives it (chat with tools, streaming, an assistant turn sent back as the
library itself keeps it) over an httpx mock transport that records the request and answers with a canned reply
shaped as OpenAI's, Anthropic's or Ollama's own answers (so the library's objects carry every field the real
services return, e.g. `refusal`, `annotations`, `audio` on an OpenAI assistant message).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "clients"
MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

OPENAI_TOOL_CALL_ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL, "system_fingerprint": None,
    "service_tier": "default",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
        "role": "assistant", "content": None, "refusal": None, "annotations": [], "audio": None,
        "function_call": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
ANTHROPIC_TOOL_USE_ANSWER = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "tool_use",
    "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5},
    "content": [{"type": "text", "text": "Let me look that up."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}
OLLAMA_TOOL_CALL_ANSWER = {
    "model": MODEL, "created_at": "2026-12-04T00:00:00Z", "done": True, "done_reason": "stop",
    "message": {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}}


class Recorder:
    """A mock transport: keeps every request and answers with `answer` (or an empty 500 when none)."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.requests: list[Any] = []
        self.answer = answer

    def __call__(self, request: Any) -> httpx.Response:
        self.requests.append(request)
        if self.answer is None:
            return httpx.Response(500, json={"error": {"message": "recorded", "type": "server_error"}})
        return httpx.Response(200, json=self.answer)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def write(client: str, call: str, library: str, how: str, request: Any) -> None:
    url = request.url
    write_record(client, call, library, importlib.metadata.version(library), f"tests/tools/build_client_fixtures.py: {how}",
                 request.method, url.path, url.query.decode(), dict(request.headers.items()), request.content)


def write_record(client: str, call: str, program: str, version: str, how: str, method: str, path: str, query: str,
                 headers: dict[str, str], content: bytes) -> None:
    """One corpus file (tests/fixtures/clients/README.md): the request, with only the headers a server reads."""
    record = {
        "source": {"program": program, "version": version, "captured": datetime.date.today().isoformat(),
                   "how": how},
        "method": method, "path": path, "query": query,
        "headers": {k: v for k, v in headers.items()
                    if k in ("content-type", "accept", "anthropic-version", "anthropic-beta", "user-agent")},
        "body": json.loads(content),
    }
    file = OUT / client / f"{call}.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print("wrote", file.relative_to(OUT.parents[1]))


def quietly(call: Callable[[], Any]) -> None:
    try:
        result = call()
        for _ in result if hasattr(result, "__iter__") and not isinstance(result, dict) else ():
            pass
    except Exception:  # the canned 500 ends the call once its request is recorded
        pass


def openai_python() -> None:
    import openai

    recorder = Recorder()
    client = openai.OpenAI(base_url="http://server/v1", api_key="unused", max_retries=0,
                           http_client=httpx.Client(transport=recorder.transport()))
    messages: list[Any] = [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": "Weather in Paris?"}]
    quietly(lambda: client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL],
                                                   stream=True, stream_options={"include_usage": True}))
    write("openai-python", "chat_tools_stream", "openai", "client.chat.completions.create(stream=True, tools=...)",
          recorder.requests[-1])

    recorder.answer = OPENAI_TOOL_CALL_ANSWER
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    recorder.answer = None
    message = first.choices[0].message
    echoed = [*messages, message, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C"}]
    quietly(lambda: client.chat.completions.create(model=MODEL, messages=echoed, tools=[WEATHER_TOOL]))
    write("openai-python", "chat_assistant_echo", "openai",
          "the assistant message object of a tool-call answer appended to messages as returned, then the tool result",
          recorder.requests[-1])

    quietly(lambda: client.responses.create(model=MODEL, input="Weather in Paris?", stream=True, tools=[
        {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
         "parameters": WEATHER_TOOL["function"]["parameters"], "strict": False}]))
    write("openai-python", "responses_tools_stream", "openai", "client.responses.create(stream=True, tools=...)",
          recorder.requests[-1])


def anthropic_sdk() -> None:
    import anthropic
    import httpx2  # the anthropic SDK's own fork of httpx

    recorder = Recorder(ANTHROPIC_TOOL_USE_ANSWER)

    def answer(request: httpx2.Request) -> httpx2.Response:
        response = recorder(request)  # type: ignore[arg-type]  # the same request shape
        return httpx2.Response(response.status_code, content=response.content,
                               headers={"content-type": "application/json"})

    client = anthropic.Anthropic(base_url="http://server", api_key="unused", max_retries=0,
                                 http_client=httpx2.Client(transport=httpx2.MockTransport(answer)))
    tool = {"name": "get_weather", "description": "The current weather in a city.",
            "input_schema": WEATHER_TOOL["function"]["parameters"]}
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=256, system="You are terse.", messages=messages,
                                   tools=[tool])
    recorder.answer = None
    echoed = [*messages, {"role": "assistant", "content": first.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]
    quietly(lambda: client.messages.create(model=MODEL, max_tokens=256, messages=echoed, tools=[tool], stream=True))
    write("anthropic-python", "messages_tool_result_stream", "anthropic",
          "the answer's content blocks (text + tool_use objects) sent back as the assistant turn, a tool_result, "
          "stream=True", recorder.requests[-1])


def langchain_ollama() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_ollama import ChatOllama

    recorder = Recorder(OLLAMA_TOOL_CALL_ANSWER)
    chat = ChatOllama(model=MODEL, base_url="http://server", temperature=0,
                      client_kwargs={"transport": recorder.transport()}).bind_tools([WEATHER_TOOL])
    first = chat.invoke([HumanMessage("Weather in Paris?")])
    assert isinstance(first, AIMessage) and first.tool_calls
    quietly(lambda: chat.invoke([HumanMessage("Weather in Paris?"), first,
                                 ToolMessage("18 C", tool_call_id=first.tool_calls[0]["id"] or "call_1")]))
    write("langchain-ollama", "chat_tool_result", "langchain-ollama",
          "ChatOllama.bind_tools([...]).invoke: its AIMessage with tool_calls sent back, then a ToolMessage",
          recorder.requests[-1])


if __name__ == "__main__":
    openai_python()
    anthropic_sdk()
    langchain_ollama()
