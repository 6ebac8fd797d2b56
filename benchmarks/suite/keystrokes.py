"""Code completion in the editor (issue 16): a keystroke replay against `POST /infill`, driven the way llama.vscode
and llama.vim drive llama-server. A real source file of this repository (SOURCE, ~1,500 tokens) is typed again,
line by line, over a stretch of lines removed from it: on each fresh line a first request (the cursor after the
indentation), then one request a word, each sent while the previous one still streams and cancelling it by closing
its connection; the last one of each line (the whole line typed) runs to its end. Both servers replay each line
one after the other (a paired design), their order alternating line by line. The summaries and the Markdown are
in keystrokes_report.py."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

from edge_llm.cli.bench_stats import error_message

from .keystrokes_report import KEYSTROKE, NEW_LINE
from .measure import CpuWatch, wait_for_quiet
from .plan import REPO, Plan
from .real_client import running_from_metrics
from .structured import Server

logger = logging.getLogger(__name__)

SOURCE = "src/edge_llm/cli/preflight.py"  # 137 lines, 1,530 tokens with the default model
SOURCE_COMMIT = "c26b9f6c959ea84a3a376a7fe430527f2b8ec22b"  # pinned: the workload stays the same as the file changes


@dataclass(frozen=True)
class Stretch:
    """Lines `first`..`last` (1-based, inclusive) are typed again; the line before them is typed first as a
    warm-up (not measured)."""

    first: int
    last: int

    @property
    def warmup(self) -> int:
        return self.first - 1

    def lines(self, limit: int | None = None) -> list[int]:
        return list(range(self.first, self.last + 1))[:limit]


STRETCHES = (Stretch(80, 99), Stretch(56, 75))  # available_memory()'s body; check_port()'s (long message lines)
QUICK_LINES = 3  # --quick: the first stretch's first lines only
N_PREDICT = 32
T_MAX_PROMPT_MS = 500  # llama.vscode's defaults; neither server cuts a prompt short
T_MAX_PREDICT_MS = 1000
N_PREFIX_LINES = 256  # llama.vim's n_prefix and n_suffix
N_SUFFIX_LINES = 64
MAX_KEYSTROKES = 8  # requests a line at most, after the fresh line's (longer lines: evenly spaced words)
TYPING_GAP_S = 0.2  # the next keystroke comes this long after the suggestion started to show
SHOW_TIMEOUT_S = 60.0  # a suggestion that has not started by then is cancelled by the next keystroke
PEER_PARALLEL = 4  # llama-server's default (-np auto: 4 slots, unified KV), which llama.vscode's presets keep
PEER_FLAGS = ("--cache-reuse", "256")  # as llama.vscode recommends (and its --fim-qwen-*-default presets set)
CACHED_COUNTERS = ("edge_llm_cached_prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")
ALL_PROMPT_COUNTER = "edge_llm_prompt_tokens_total"  # ours: every prompt token, cached ones included
PROCESSED_COUNTER = "llamacpp:prompt_tokens_total"  # llama-server: cached ones excluded


def source_lines(path: str = SOURCE, commit: str = SOURCE_COMMIT) -> list[str]:
    """The file as of `commit` (the working tree's when git cannot show it), lines with their newlines."""
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode == 0:
        return shown.stdout.splitlines(keepends=True)
    logger.warning("git cannot show %s at %s (%s): typing the working tree's copy", path, commit[:7],
                   shown.stderr.strip())
    return (REPO / path).read_text(encoding="utf-8").splitlines(keepends=True)


def indentation(text: str) -> int:
    return len(text) - len(text.lstrip(" \t"))


def keystroke_columns(text: str, limit: int = MAX_KEYSTROKES) -> list[int]:
    """Where the cursor is at each request while `text` (one line, no newline) is typed: after the indentation
    (the fresh line's request), then after each word (at most `limit`, evenly spaced, the line's end last)."""
    ends = [match.end() for match in re.finditer(r"\S+", text)]
    if len(ends) > limit:
        ends = [ends[round(i * (len(ends) - 1) / (limit - 1))] for i in range(limit)]
    return [indentation(text), *ends]


def infill_body(lines: Sequence[str], line: int, column: int, resume: int) -> dict[str, Any]:
    """The request llama.vscode sends while `line` (1-based) is typed up to `column`, the lines from `resume` on
    following it (those between are not typed yet): the lines before as input_prefix, the typed part of the line
    as prompt, the rest of the line (nothing: the cursor is at its end) and the following lines as input_suffix.
    Greedy (temperature 0) on both servers, so that they complete alike; no input_extra (the ring of other files'
    chunks)."""
    current = lines[line - 1].rstrip("\n")
    return {
        "input_prefix": "".join(lines[max(0, line - 1 - N_PREFIX_LINES):line - 1]),
        "input_suffix": "\n" + "".join(lines[resume - 1:resume - 1 + N_SUFFIX_LINES]),
        "input_extra": [],
        "prompt": current[:column],
        "n_predict": N_PREDICT,
        "n_indent": indentation(current),
        "t_max_prompt_ms": T_MAX_PROMPT_MS,
        "t_max_predict_ms": T_MAX_PREDICT_MS,
        "cache_prompt": True,
        "stream": True,
        "temperature": 0.0,
    }


@dataclass
class Request:
    """One keystroke's request as it streamed; times on the monotonic clock."""

    line: int
    column: int
    kind: str  # NEW_LINE: the first request on a fresh line; KEYSTROKE: after a word
    runs_to_end: bool  # the line's last: never cancelled
    sent: float = 0.0
    first: float | None = None  # the first event with content
    ended: float | None = None  # the stream's end (its final event), or when it was cancelled
    content: str = ""
    prompt_tokens: int | None = None  # tokens_evaluated, in every event
    final: dict[str, Any] | None = None  # from the stop: true event
    cancelled: bool = False
    error: str | None = None
    shown: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def feed(self, data: str, now: float) -> bool:
        """One SSE event's data; True when the stream has ended (its final event, an error)."""
        if data == "[DONE]":
            return True
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"invalid JSON in stream: {data[:80]!r}"
            return True
        if not isinstance(event, dict):
            return False
        if "error" in event:
            self.error = error_message(event["error"])
            return True
        if isinstance(event.get("tokens_evaluated"), int):
            self.prompt_tokens = event["tokens_evaluated"]
        if isinstance(event.get("content"), str) and event["content"]:
            self.content += event["content"]
            if self.first is None:
                self.first = now
                self.shown.set()
        if event.get("stop") is True:
            self.final, self.ended = final_fields(event), now
            return True
        return False

    def to_dict(self) -> dict[str, Any]:
        ttft = (self.first if self.first is not None else self.ended if self.final is not None else None)
        return {
            "line": self.line, "column": self.column, "kind": self.kind, "runs_to_end": self.runs_to_end,
            "ttft_s": None if ttft is None else ttft - self.sent,
            "end_s": None if self.ended is None or self.final is None else self.ended - self.sent,
            "content": self.content, "prompt_tokens": self.prompt_tokens, "final": self.final,
            "cancelled": self.cancelled, "error": self.error,
        }


def final_fields(event: dict[str, Any]) -> dict[str, Any]:
    """What the final event reports: prompt tokens (tokens_evaluated), the prefix cache's share (timings.cache_n;
    llama-server's tokens_cached counts the slot's whole cache, the generated tokens too), the prefill and
    decode times."""
    timings = event.get("timings") if isinstance(event.get("timings"), dict) else {}
    return {
        "tokens_evaluated": event.get("tokens_evaluated"),
        "tokens_predicted": event.get("tokens_predicted"),
        "tokens_cached": event.get("tokens_cached"),
        "stop_type": event.get("stop_type"),
        **{key: timings.get(key) for key in ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                             "predicted_per_token_ms")},
    }


async def stream_infill(client: httpx.AsyncClient, url: str, body: dict[str, Any], request: Request) -> None:
    """One streamed /infill request into `request`; errors are recorded, never raised (a cancel is raised)."""
    request.sent = time.monotonic()
    try:
        async with client.stream("POST", url + "/infill", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                request.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            async for event in EventSource(response).aiter_sse():
                if request.feed(event.data, time.monotonic()):
                    break
            else:
                if request.final is None and request.error is None:
                    request.error = "stream ended without its final event"
    except httpx.HTTPError as exc:  # httpx_sse.SSEError (not an event stream) is one too
        request.error = f"{type(exc).__name__}: {exc}"
    finally:
        request.ended = request.ended or time.monotonic()  # a cancel's moment, unless the answer had ended
        request.shown.set()


async def _cancel(task: asyncio.Task[None], request: Request) -> None:
    """Closes a request's connection if it still streams (the editor's next keystroke)."""
    if not task.done():
        request.cancelled = request.final is None
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def replay_line(url: str, lines: Sequence[str], line: int, resume: int,
                      gap_s: float = TYPING_GAP_S) -> list[Request]:
    """Types `line` again: each keystroke's request is sent when the previous suggestion has started to show and
    `gap_s` has passed, and the previous one is cancelled at that moment; the last runs to its end."""
    columns = keystroke_columns(lines[line - 1].rstrip("\n"))
    requests: list[Request] = []
    previous: tuple[asyncio.Task[None], Request] | None = None
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        for index, column in enumerate(columns):
            request = Request(line, column, NEW_LINE if index == 0 else KEYSTROKE, index == len(columns) - 1)
            task = asyncio.create_task(stream_infill(client, url, infill_body(lines, line, column, resume), request))
            if previous is not None:
                await _cancel(*previous)
            requests.append(request)
            if request.runs_to_end:
                await task
                break
            try:
                await asyncio.wait_for(request.shown.wait(), SHOW_TIMEOUT_S)
            except asyncio.TimeoutError:
                logger.warning("line %d column %d: no suggestion after %.0f s", line, column, SHOW_TIMEOUT_S)
            await asyncio.sleep(gap_s)
            previous = (task, request)
    return requests


def prompt_counters(url: str) -> dict[str, float | None]:
    """The server's prompt-token counters (all requests, cancelled ones too): processed and from the cache."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {"processed": None, "cached": None}
    cached = running_from_metrics(text, CACHED_COUNTERS)
    processed = running_from_metrics(text, (PROCESSED_COUNTER,))
    if processed is None:
        every = running_from_metrics(text, (ALL_PROMPT_COUNTER,))
        processed = None if every is None or cached is None else every - cached
    return {"processed": processed, "cached": cached}


def _difference(after: dict[str, float | None], before: dict[str, float | None]) -> dict[str, float | None]:
    return {key: None if after[key] is None or before[key] is None else after[key] - before[key] for key in after}


def replay_measured(server: Server, lines: Sequence[str], line: int, resume: int,
                    pids: Sequence[int]) -> dict[str, Any]:
    """One line on one server: its requests, the server's prompt-token counters over it, other processes' CPU."""
    before = prompt_counters(server.url)
    with CpuWatch(pids) as watch:
        requests = asyncio.run(replay_line(server.url, lines, line, resume))
    return {"line": line, "neighbour_cpu": watch.neighbour_share,
            "server_prompt_tokens": _difference(prompt_counters(server.url), before),
            "requests": [r.to_dict() for r in requests]}


def workload(plan: Plan) -> dict[str, Any]:
    stretches = STRETCHES[:1] if plan.quick else STRETCHES
    return {"source": SOURCE, "source_commit": SOURCE_COMMIT[:7],
            "stretches": [{"warmup": s.warmup, "lines": s.lines(QUICK_LINES if plan.quick else None),
                           "resume": s.last + 1} for s in stretches],
            "n_predict": N_PREDICT, "t_max_predict_ms": T_MAX_PREDICT_MS, "typing_gap_s": TYPING_GAP_S,
            "max_keystrokes_per_line": MAX_KEYSTROKES, "peer_parallel": PEER_PARALLEL,
            "peer_flags": list(PEER_FLAGS)}


def run_keystrokes(servers: Sequence[Server], plan: Plan,
                   measured: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """runs[server] = {"warmup": [line records], "lines": [line records]}: for each stretch, a warm-up line on each
    server, then each line on both servers one right after the other (ours first on even lines).
    `measured(runs)` is called after each line pair (the caller writes what there is so far)."""
    lines = source_lines()
    pids = [s.pid for s in servers]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s.name: {"warmup": [], "lines": []} for s in servers}
    for stretch in workload(plan)["stretches"]:
        resume = stretch["resume"]  # the lines after the whole stretch follow the cursor's (--quick too)
        label = f"keystrokes, lines {stretch['lines'][0]}-{stretch['lines'][-1]}"
        wait_for_quiet(label + " (warm-up)", plan.quiet_wait_s)
        for server in servers:
            record = replay_measured(server, lines, stretch["warmup"], resume, pids)
            runs[server.name]["warmup"].append(record)
            first = record["requests"][0]
            logger.info("%s warm-up line %d: first request %s ms (%s prompt tokens, %s cached)", server.name,
                        stretch["warmup"], _ms(first["ttft_s"]), first["prompt_tokens"],
                        (first["final"] or {}).get("cache_n"))
        for index, line in enumerate(stretch["lines"]):
            wait_for_quiet(f"{label}, line {line}", plan.quiet_wait_s)
            for server in servers if index % 2 == 0 else list(reversed(servers)):
                record = replay_measured(server, lines, line, resume, pids)
                runs[server.name]["lines"].append(record)
                logger.info("%s line %d: %d requests, TTFT %s ms, %d cancelled, other CPU %.0f%%", server.name,
                            line, len(record["requests"]),
                            " ".join(_ms(r["ttft_s"]) for r in record["requests"]),
                            sum(r["cancelled"] for r in record["requests"]), record["neighbour_cpu"] * 100)
            if measured is not None:
                measured(runs)
    return runs


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.0f}"
