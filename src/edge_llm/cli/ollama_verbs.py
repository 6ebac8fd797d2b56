"""Ollama's CLI verbs for people who type them: `edge-llm run NAME [PROMPT]`, `pull NAME`, `list`, `ps`.

Like Ollama's, they talk to a running server (`--host`, default $OLLAMA_HOST, else the server `edge-llm chat` talks
to): `run` is `edge-llm chat --model NAME` (one-shot with a prompt), `pull` asks the server to fetch a catalogue
model (/api/pull, progress as it streams), `list` and `ps` print /api/tags and /api/ps as Ollama's tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from edge_llm.cli.chat import DEFAULT_URL, env_api_key

_TIMEOUT = 30.0


OLLAMA_PORT = 11434


def _default_host() -> str:
    host = os.environ.get("OLLAMA_HOST", "").strip()
    return ollama_host(host) if host else DEFAULT_URL


def ollama_host(value: str) -> str:
    """$OLLAMA_HOST read as Ollama reads it (envconfig.Host): no scheme means http, and then no port means
    Ollama's 11434; `0.0.0.0` (what a server is told to listen on) is reached at 127.0.0.1."""
    if "://" in value:
        return value
    hostport = value.split("/", 1)[0]
    host, port = hostport, ""
    if hostport.startswith("["):  # [::1]:port
        host, _, rest = hostport.partition("]")
        host, port = host + "]", rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "[::]" else host
    return f"http://{host}:{port or OLLAMA_PORT}"


def add_verbs(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host", default=_default_host(), metavar="URL",
                        help=f"the running server (default: $OLLAMA_HOST, else {DEFAULT_URL})")
    common.add_argument("--api-key", default=env_api_key(), metavar="KEY",
                        help="sent as 'Authorization: Bearer KEY' (default: the first of EDGE_LLM_API_KEY)")
    run = commands.add_parser("run", parents=[common], help="chat with a model of a running server (Ollama's run)")
    run.add_argument("name", metavar="NAME", help="the model (`edge-llm list`), e.g. qwen2.5-coder:0.5b")
    run.add_argument("prompt", nargs="*", metavar="PROMPT", help="one-shot: print the answer and exit")
    run.set_defaults(handler=_run)
    pull = commands.add_parser("pull", parents=[common], help="have a running server fetch a catalogue model")
    pull.add_argument("name", metavar="NAME", help="a catalogue model (`edge-llm model list`), e.g. gemma3:270m")
    pull.set_defaults(handler=_pull)
    listing = commands.add_parser("list", parents=[common], aliases=["ls"],
                                  help="the models a running server can serve (Ollama's list)")
    listing.set_defaults(handler=_list)
    ps = commands.add_parser("ps", parents=[common], help="the models a running server has loaded (Ollama's ps)")
    ps.set_defaults(handler=_ps)


def _client(args: argparse.Namespace) -> Any:
    import httpx

    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.host.rstrip("/"), headers=headers, timeout=_TIMEOUT)


def _fail(message: str) -> int:
    sys.stderr.write(f"edge-llm: error: {message}\n")
    return 1


def _error_of(response: Any) -> str:
    try:
        return str(response.json().get("error") or response.text)
    except ValueError:
        return response.text or f"HTTP {response.status_code}"


def _get(args: argparse.Namespace, path: str) -> dict[str, Any] | None:
    import httpx

    try:
        with _client(args) as client:
            response = client.get(path)
    except httpx.HTTPError as exc:
        _fail(f"could not reach the server at {args.host}: {exc}")
        return None
    if response.status_code != 200:
        _fail(_error_of(response))
        return None
    return dict(response.json())


def human_size(size: int) -> str:
    """Sizes as Ollama prints them (decimal units)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def human_duration(seconds: float) -> str:
    """Ollama's format.HumanDuration: "Less than a second", "12 seconds", "About a minute", "4 minutes", …"""
    whole = int(seconds)
    if whole < 1:
        return "Less than a second"
    if whole < 60:
        return "1 second" if whole == 1 else f"{whole} seconds"
    minutes = whole // 60
    if minutes < 60:
        return "About a minute" if minutes == 1 else f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)  # Go's math.Round: halves away from zero
    for limit, unit, hours_per_unit in ((48, "hours", 1), (24 * 14, "days", 24), (24 * 60, "weeks", 24 * 7),
                                        (24 * 730, "months", 24 * 30)):
        if hours < limit:
            return "About an hour" if hours == 1 else f"{hours // hours_per_unit} {unit}"
    return f"{int(seconds / 3600 / 24 / 365)} years"


def human_time(moment: str, now: datetime | None = None) -> str:
    """Ollama's format.HumanTime of a time /api/tags or /api/ps wrote: "3 hours ago", "4 minutes from now",
    "Forever" (more than 20 years ahead: a model never unloaded)."""
    try:
        when = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    except ValueError:
        return moment
    delta = ((now or datetime.now(timezone.utc)) - when).total_seconds()
    if delta / 3600 / 24 / 365 < -20:
        return "Forever"
    return f"{human_duration(-delta)} from now" if delta < 0 else f"{human_duration(delta)} ago"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("    ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _list(args: argparse.Namespace) -> int:
    answer = _get(args, "/api/tags")
    if answer is None:
        return 1
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    for model in answer.get("models", []):
        rows.append([model["name"], (model.get("digest") or "")[:12], human_size(int(model.get("size") or 0)),
                     human_time(str(model.get("modified_at", "")))])
    print(table(rows))
    return 0


def _ps(args: argparse.Namespace) -> int:
    answer = _get(args, "/api/ps")
    if answer is None:
        return 1
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]]
    for model in answer.get("models", []):
        until = human_time(str(model.get("expires_at", "")))
        rows.append([model["name"], (model.get("digest") or "")[:12], human_size(int(model.get("size") or 0)),
                     "100% CPU", until])
    print(table(rows))
    return 0


def _pull(args: argparse.Namespace) -> int:
    import httpx

    try:
        with _client(args) as client, client.stream("POST", "/api/pull", json={"model": args.name},
                                                     timeout=None) as response:
            if response.status_code != 200:
                response.read()
                return _fail(_error_of(response))
            for line in response.iter_lines():
                if not line.strip():
                    continue
                status = json.loads(line)
                if "error" in status:
                    return _fail(str(status["error"]))
                total, completed = status.get("total"), status.get("completed")
                text = status.get("status", "")
                if total:
                    text += f" {100 * int(completed or 0) // int(total)}% {human_size(int(completed or 0))}/" \
                            f"{human_size(int(total))}"
                print(text, flush=True)
    except httpx.HTTPError as exc:
        return _fail(f"could not reach the server at {args.host}: {exc}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from edge_llm.cli.chat import main as chat_main

    chat_args = argparse.Namespace(url=args.host, prompt=" ".join(args.prompt) if args.prompt else None,
                                   api_key=args.api_key, system="", temperature=None, top_p=None, max_tokens=None,
                                   model=args.name, quiet=False)
    return chat_main(chat_args)
