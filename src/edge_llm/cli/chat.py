"""`edge-llm chat`: a terminal chat against a running server's /v1/chat/completions (streaming).

Interactive by default: the conversation is kept until `/reset`; `/system TEXT`, `/set NAME VALUE`,
Ctrl+C stops the answer being streamed (closing the stream makes the server cancel the generation)
without leaving; Ctrl+D or `exit` leaves. One-shot with `-p QUESTION` (`-p -` reads stdin): the
answer goes to stdout, nothing else does, so it pipes cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # httpx is imported on use: `edge-llm serve` builds this parser too
    import httpx

DEFAULT_URL = "http://127.0.0.1:3000"
_SETTABLE = {"temperature": float, "top_p": float, "max_tokens": int}
_ALIASES = {"top-p": "top_p", "topp": "top_p", "max-tokens": "max_tokens", "temp": "temperature"}
_EXIT_WORDS = {"exit", "quit", "/exit", "/quit", ":q"}
HELP = """commands:
  /reset               forget the conversation (the system prompt stays)
  /system TEXT         set the system prompt (/system alone clears it)
  /set NAME VALUE      temperature, top_p or max_tokens (/set alone shows them)
  /help                this text
  exit, /exit, Ctrl+D  leave
Ctrl+C stops an answer; a line ending in \\ continues on the next line."""


class ChatError(Exception):
    """A problem to show in one line (server unreachable, refused request, bad setting)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    parser.add_argument("-p", "--prompt", metavar="QUESTION",
                        help="one-shot: print the answer to QUESTION and exit ('-' reads it from stdin)")
    parser.add_argument("--api-key", default=env_api_key(), metavar="KEY",
                        help="sent as 'Authorization: Bearer KEY' (default: the first of EDGE_LLM_API_KEY)")
    parser.add_argument("--system", default="", metavar="TEXT", help="system prompt")
    parser.add_argument("--temperature", type=float, default=None, metavar="X", help="default: the server's")
    parser.add_argument("--top-p", type=float, default=None, metavar="X", help="default: the server's")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N", help="default: the server's")
    parser.add_argument("--model", default=None, help="model name to send (default: whatever the server runs)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no banner or per-answer figures")


def env_api_key() -> str | None:
    value = os.environ.get("EDGE_LLM_API_KEY", "")
    first = value.split(",")[0].strip()
    return first or None


@dataclass
class Answer:
    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    started: float = field(default_factory=time.monotonic)
    first_at: float | None = None
    ended: float | None = None
    stopped: bool = False
    pieces: int = 0  # content chunks so far: the token count until the usage arrives

    def figures(self) -> str:
        tokens = self.completion_tokens if self.completion_tokens is not None else self.pieces
        parts = []
        if self.first_at is not None:
            parts.append(f"TTFT {self.first_at - self.started:.2f} s")
            seconds = (self.ended or time.monotonic()) - self.first_at
            if tokens > 1 and seconds > 0:
                parts.append(f"{(tokens - 1) / seconds:.1f} tok/s")
        parts.append(f"{tokens} token{'' if tokens == 1 else 's'}")
        if self.stopped:
            parts.append("stopped")
        elif self.finish_reason and self.finish_reason != "stop":
            parts.append(f"finish: {self.finish_reason}")
        return " · ".join(parts)


@dataclass
class Conversation:
    system: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    settings: dict[str, float | int] = field(default_factory=dict)
    model: str | None = None

    def body(self) -> dict[str, Any]:
        messages = ([{"role": "system", "content": self.system}] if self.system.strip() else []) + self.messages
        body: dict[str, Any] = {"messages": messages, "stream": True, "stream_options": {"include_usage": True},
                                **self.settings}
        if self.model:
            body["model"] = self.model
        return body


class ChatClient:
    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = self._new_client()

    def _new_client(self) -> httpx.Client:
        import httpx

        # No read timeout: an answer may wait in the server's queue; Ctrl+C is the way out.
        return httpx.Client(headers=self.headers, timeout=httpx.Timeout(10.0, read=None))

    def close(self) -> None:
        self._client.close()

    def reset_connection(self) -> None:
        """After Ctrl+C cut a request short: a fresh pool, so nothing half-read is reused."""
        self._client.close()
        self._client = self._new_client()

    def model_name(self) -> str:
        response = self._request("GET", "/v1/models")
        data = response.json().get("data") or [{}]
        return str(data[0].get("id", "?"))

    def stream(self, body: dict[str, Any], answer: Answer, out: TextIO) -> None:
        """Streams the answer's text to `out` as it arrives. KeyboardInterrupt leaves the `with`,
        which closes the connection: the server notices the disconnect and cancels the generation."""
        import httpx
        from httpx_sse import EventSource, SSEError

        try:
            with self._client.stream("POST", self.url + "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise ChatError(_error_text(response))
                for event in EventSource(response).iter_sse():
                    if event.data == "[DONE]":
                        break
                    self._take(json.loads(event.data), answer, out)
        except SSEError as exc:
            raise ChatError(f"{self.url} did not answer with an event stream ({exc})") from None
        except httpx.TransportError as exc:
            raise ChatError(self._unreachable(exc)) from None
        answer.ended = time.monotonic()

    @staticmethod
    def _take(chunk: dict[str, Any], answer: Answer, out: TextIO) -> None:
        if "error" in chunk:
            raise ChatError(f"the server stopped the answer: {chunk['error'].get('message', chunk['error'])}")
        usage = chunk.get("usage")
        if usage:
            answer.completion_tokens = usage.get("completion_tokens")
            answer.prompt_tokens = usage.get("prompt_tokens")
            answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                if answer.first_at is None:
                    answer.first_at = time.monotonic()
                answer.text += piece
                answer.pieces += 1
                out.write(piece)
                out.flush()
            if choice.get("finish_reason"):
                answer.finish_reason = choice["finish_reason"]

    def _request(self, method: str, path: str) -> httpx.Response:
        import httpx

        try:
            response = self._client.request(method, self.url + path)
        except httpx.TransportError as exc:
            raise ChatError(self._unreachable(exc)) from None
        if response.status_code != 200:
            raise ChatError(_error_text(response))
        return response

    def _unreachable(self, exc: Exception) -> str:
        return f"cannot reach {self.url} ({type(exc).__name__}): is `edge-llm serve` running there?"


def _error_text(response: httpx.Response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()[:300] or response.reason_phrase
    if response.status_code == 401:
        problem = "needs an API key" if "missing" in message.lower() else "refused the API key"
        return f"the server {problem}: pass --api-key KEY (or set EDGE_LLM_API_KEY)"
    return f"{response.status_code}: {message}"


# ---- one-shot -------------------------------------------------------------------------------------


def run_once(client: ChatClient, conversation: Conversation, question: str) -> int:
    conversation.messages.append({"role": "user", "content": question})
    answer = Answer()
    try:
        client.stream(conversation.body(), answer, sys.stdout)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130
    except ChatError as exc:
        sys.stderr.write(f"edge-llm: error: {exc}\n")
        return 1
    if not answer.text.endswith("\n"):
        sys.stdout.write("\n")
    return 0


# ---- interactive ----------------------------------------------------------------------------------


class Terminal:
    """Prompts and figures go to stderr (dimmed on a terminal); answers to stdout."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty_in = sys.stdin.isatty()
        self.dim = sys.stderr.isatty() and os.environ.get("NO_COLOR") is None
        if self.tty_in:
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:
                pass

    def note(self, text: str, *, always: bool = False) -> None:
        if self.quiet and not always:
            return
        sys.stderr.write(f"\x1b[2m{text}\x1b[0m\n" if self.dim else f"{text}\n")
        sys.stderr.flush()

    def read(self) -> str:
        """One message; a line ending in a backslash continues. EOFError at the end of input."""
        lines: list[str] = []
        while True:
            line = self._line("... " if lines else "you> ")
            if line.endswith("\\"):
                lines.append(line[:-1])
                continue
            lines.append(line)
            return "\n".join(lines)

    def _line(self, prompt: str) -> str:
        if self.tty_in:
            return input(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")


def run_interactive(client: ChatClient, conversation: Conversation, terminal: Terminal) -> int:
    # A program started in the background of a non-interactive shell (`edge-llm chat &`, a script, a test
    # harness) inherits SIGINT ignored, so Ctrl+C would never stop an answer; Python's own handler restores it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        model = conversation.model or client.model_name()  # the server's first model is its default
    except ChatError as exc:
        sys.stderr.write(f"edge-llm: error: {exc}\n")
        return 1
    terminal.note(f"edge-llm chat · {model} at {client.url} · /help for commands, Ctrl+C stops an answer")
    while True:
        try:
            text = terminal.read()
        except EOFError:
            terminal.note("")
            return 0
        except KeyboardInterrupt:
            terminal.note("\n(Ctrl+D or exit leaves)", always=True)
            continue
        stripped = text.strip()
        if not stripped:
            continue
        if stripped.lower() in _EXIT_WORDS:
            return 0
        if stripped.startswith("/"):
            terminal.note(command(conversation, stripped), always=True)
            continue
        ask(client, conversation, terminal, text)


def ask(client: ChatClient, conversation: Conversation, terminal: Terminal, text: str) -> None:
    conversation.messages.append({"role": "user", "content": text})
    answer = Answer()
    try:
        client.stream(conversation.body(), answer, sys.stdout)
    except KeyboardInterrupt:
        answer.stopped = True
        answer.ended = time.monotonic()
        client.reset_connection()
    except ChatError as exc:
        conversation.messages.pop()
        if answer.text:
            sys.stdout.write("\n")
        terminal.note(f"error: {exc}", always=True)
        return
    if (answer.text and not answer.text.endswith("\n")) or (answer.stopped and sys.stdout.isatty()):
        sys.stdout.write("\n")  # (on a terminal, after the ^C it echoed)
    sys.stdout.flush()
    if answer.text:
        conversation.messages.append({"role": "assistant", "content": answer.text})
    else:
        conversation.messages.pop()  # nothing came back: the question is not part of the conversation
    terminal.note(f"[{answer.figures()}]", always=answer.stopped)


def command(conversation: Conversation, line: str) -> str:
    """Runs a /command; returns what to tell the user."""
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    if name == "/reset":
        conversation.messages.clear()
        return "(conversation cleared)"
    if name == "/system":
        conversation.system = rest
        return f"(system prompt set: {rest})" if rest else "(system prompt cleared)"
    if name == "/set":
        if not rest:
            shown = {key: conversation.settings.get(key, "server default") for key in _SETTABLE}
            return "  ".join(f"{key}={value}" for key, value in shown.items())
        key, _, value = rest.partition(" ")
        key = _ALIASES.get(key.lower(), key.lower())
        if key not in _SETTABLE:
            return f"(unknown setting {key!r}: use temperature, top_p or max_tokens)"
        if value.strip().lower() in ("", "default"):
            conversation.settings.pop(key, None)
            return f"({key} back to the server's default)"
        try:
            conversation.settings[key] = _SETTABLE[key](value.strip())
        except ValueError:
            return f"({key} needs a number, got {value.strip()!r})"
        return f"({key} = {conversation.settings[key]})"
    if name in ("/help", "/?"):
        return HELP
    return f"(unknown command {name}; /help lists them)"


def main(args: argparse.Namespace) -> int:
    conversation = Conversation(system=args.system, model=args.model)
    for key, value in (("temperature", args.temperature), ("top_p", args.top_p), ("max_tokens", args.max_tokens)):
        if value is not None:
            conversation.settings[key] = value
    client = ChatClient(args.url, args.api_key)
    try:
        if args.prompt is not None:
            question = sys.stdin.read() if args.prompt == "-" else args.prompt
            if not question.strip():
                sys.stderr.write("edge-llm: error: the question is empty\n")
                return 1
            return run_once(client, conversation, question)
        return run_interactive(client, conversation, Terminal(args.quiet))
    finally:
        client.close()
