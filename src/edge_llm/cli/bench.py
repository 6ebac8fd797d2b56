"""`edge-llm bench URL`: a load generator for any OpenAI-compatible chat server.

For each concurrency level, `concurrency` clients send `requests` streamed chat
completions between them (closed loop: a client sends its next request when the
previous one ends) and the level reports time to first token, inter-token latency,
per-stream decode speed, aggregate throughput and errors.

Definitions (all times on the client's monotonic clock):
- TTFT: request sent → first chunk with non-empty `delta.content` (or `delta.tool_calls`).
- inter-token latency (ITL): gaps between consecutive content chunks of one stream.
- stream tokens/s: (completion tokens − 1) / (last content chunk − first content chunk),
  the decode speed one client sees, without the prefill.
- aggregate tokens/s: all completion tokens of the level / wall time of the level.
- server decode tokens/s: (completion tokens − 1) / the decode time the server reports in the last
  chunk's `timings` (edge-llm's `decode_ms`, llama-server's `predicted_ms`), when it sends one: the
  decode speed without the network, also for answers streamed in few chunks (a tool call).
Completion tokens come from the final `usage` chunk (`stream_options.include_usage`);
servers that send none are measured by their count of content chunks.

The measuring and statistics are pure functions in `bench_stats` (`StreamRecorder`, `summarize_level`,
`percentile`, ...); the HTTP part is here, `stream_chat` / `run_level`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import EventSource

from edge_llm.cli.bench_stats import LevelStats, StreamRecorder, StreamResult, level_wall_time, summarize_level
from edge_llm.cli.progress import ProgressBar

DEFAULT_PROMPTS: tuple[str, ...] = (
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Explain what a hash map is and how collisions are handled.",
    "Write a bash script that counts the lines of every .py file in a directory tree.",
    "Describe the difference between a process and a thread.",
    "Write a JavaScript function that debounces another function.",
    "Explain how binary search works and give its time complexity.",
    "Write a SQL query that finds the second highest salary in an employees table.",
    "What are the advantages of immutable data structures?",
    "Write a Rust function that reverses the words of a sentence.",
    "Explain what a race condition is, with a short example.",
    "Write a Python class for a simple LRU cache.",
    "Describe how HTTP keep-alive connections work.",
    "Write a Go function that merges two sorted slices.",
    "Explain the CAP theorem in a few paragraphs.",
    "Write a C function that computes the length of a null-terminated string.",
    "What is the difference between TCP and UDP?",
)

ProgressCallback = Callable[[int, int], None]



def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be positive integers")
    return levels


def parse_extra_body(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--extra-body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--extra-body must be a JSON object")
    return value


def chat_url(base_url: str) -> str:
    """Accepts `http://host:port`, `.../v1` or the full `.../v1/chat/completions`."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def models_url(base_url: str) -> str:
    return chat_url(base_url).removesuffix("/chat/completions") + "/models"


def load_prompts(path: Path | None) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not data or not all(isinstance(p, str) and p for p in data):
        raise ValueError(f"{path}: expected a non-empty JSON list of non-empty strings")
    return data


# ---- HTTP ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    base_url: str
    max_tokens: int | None = 64  # None: the body has no max_tokens (the server decides, as for most SDK clients)
    temperature: float = 0.0
    model: str | None = None
    api_key: str | None = None
    system_prompt: str | None = None
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request body

    def body(self, prompt: str) -> dict[str, Any]:
        messages: list[dict[str, str]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": prompt})
        body: dict[str, Any] = {
            "messages": messages,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.model:
            body["model"] = self.model
        body.update(self.extra_body)
        return body

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def new_client(config: BenchConfig, concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(config.timeout_s, connect=10.0),
                             headers=config.headers())


async def stream_chat(client: httpx.AsyncClient, config: BenchConfig, prompt: str,
                      deadline: float | None = None) -> StreamResult:
    """One streamed chat completion, measured; errors are recorded, never raised. At `deadline` (monotonic)
    the stream is closed (the server sees a disconnect) and the result is marked `cut`."""
    recorder = StreamRecorder(time.monotonic())
    try:
        async with client.stream("POST", chat_url(config.base_url), json=config.body(prompt)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", errors="replace")
                recorder.result.error = f"HTTP {response.status_code}: {body[:200]}"
            else:
                await _read_events(response, recorder, deadline)
    except httpx.HTTPError as exc:  # httpx_sse.SSEError (not an event stream) is one too
        recorder.result.error = f"{type(exc).__name__}: {exc}"
    return recorder.finish(time.monotonic())


async def _read_events(response: httpx.Response, recorder: StreamRecorder, deadline: float | None) -> None:
    events = EventSource(response).aiter_sse()
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        try:
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError
            event = await asyncio.wait_for(anext(events), remaining)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            recorder.result.cut = True
            return
        recorder.feed_data(event.data, time.monotonic())


def request_prompt(prompts: Sequence[str], index: int, tag: str | None) -> str:
    """The prompt of request `index`: round-robin, and made unique by `tag` when one is given.

    The tag goes first, so that a server's prefix cache can reuse what precedes the user's
    message (the system prompt) but not a whole earlier prompt: a load test whose requests repeat
    each other would mostly measure the cache.
    """
    prompt = prompts[index % len(prompts)]
    return f"[{tag}-{index}] {prompt}" if tag is not None else prompt


async def run_level(
    config: BenchConfig,
    concurrency: int,
    n_requests: int,
    prompts: Sequence[str],
    progress: ProgressCallback | None = None,
    tag: str | None = None,
    time_budget_s: float | None = None,
) -> LevelStats:
    """`concurrency` clients share `n_requests` requests; prompts are used round-robin (see `request_prompt`).
    With `time_budget_s`, no request starts after the budget and the streams still open then are closed; their
    tokens so far count (`LevelStats.cut_at_budget` says how many)."""
    results: list[StreamResult] = []
    next_index = iter(range(n_requests))
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        for index in next_index:
            if deadline is not None and time.monotonic() >= deadline:
                return
            results.append(await stream_chat(client, config, request_prompt(prompts, index, tag), deadline))
            if progress is not None:
                progress(len(results), n_requests)

    async with new_client(config, concurrency) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return summarize_level(concurrency, results, level_wall_time(results))


async def discover_model(config: BenchConfig) -> str | None:
    """The first model id the server lists, or None when it lists none."""
    try:
        async with httpx.AsyncClient(timeout=10.0, headers=config.headers()) as client:
            response = await client.get(models_url(config.base_url))
            response.raise_for_status()
            data = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(data[0]["id"]) if data and isinstance(data[0], dict) and "id" in data[0] else None


async def run_benchmark(
    config: BenchConfig,
    levels: Sequence[int],
    n_requests: int,
    prompts: Sequence[str],
    *,
    warmup: int = 1,
    distinct: bool = True,
    progress_factory: Callable[[int], ProgressCallback | None] | None = None,
) -> list[LevelStats]:
    """Levels in turn; with `distinct`, no two requests of the run send the same prompt."""
    if warmup > 0:
        await run_level(config, 1, warmup, prompts, tag="warmup" if distinct else None)
    stats: list[LevelStats] = []
    for concurrency in levels:
        progress = progress_factory(concurrency) if progress_factory else None
        tag = f"c{concurrency}" if distinct else None
        stats.append(await run_level(config, concurrency, n_requests, prompts, progress, tag))
    return stats


# ---- presentation --------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(stats: Sequence[LevelStats]) -> str:
    header = ("clients", "reqs", "errors", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "ITL p95 ms",
              "stream tok/s", "aggregate tok/s")
    rows = [header] + [
        (str(s.concurrency), str(s.requests), str(s.errors), _ms(s.ttft_median_s), _ms(s.ttft_p95_s),
         _ms(s.itl_median_s), _ms(s.itl_p95_s), _rate(s.stream_tokens_per_s_median),
         _rate(s.aggregate_tokens_per_s))
        for s in stats
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]
    return "\n".join(lines) + "\n"


# ---- command line ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:3000")
    parser.add_argument("--concurrency", type=parse_levels, default=[1, 4, 8], metavar="LIST",
                        help="comma-separated concurrency levels (default: 1,4,8)")
    parser.add_argument("--requests", type=int, default=16, metavar="N", help="requests per level (default: 16)")
    parser.add_argument("--max-tokens", type=int, default=64, metavar="N", help="max_tokens of each request")
    parser.add_argument("--prompts", type=Path, metavar="FILE",
                        help="JSON list of prompt strings (default: a built-in set of short distinct prompts)")
    parser.add_argument("--model", help="model name to send (default: the first one /v1/models lists)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0)")
    parser.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--repeat-prompts", action="store_true",
                        help="send the prompts as they are (by default each request's prompt is made unique with "
                        "a '[c4-17] ' tag, so that a prefix cache cannot serve whole repeated prompts)")
    parser.add_argument("--extra-body", type=parse_extra_body, default={}, metavar="JSON",
                        help="a JSON object merged into every request body, e.g. '{\"ignore_eos\": true}' for "
                        "llama-server or '{\"logit_bias\": {\"151645\": -100}}' so that every answer runs to "
                        "--max-tokens")
    parser.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed requests first (default: 1)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results as JSON to OUT")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-llm bench",
        description="Load-test an OpenAI-compatible server with streamed chat completions and report "
        "TTFT, inter-token latency, per-stream and aggregate tokens/s for each concurrency level.",
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser().parse_args(argv))


def run_cli(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.max_tokens < 1:
        sys.stderr.write("edge-llm bench: error: --requests and --max-tokens must be positive\n")
        return 2
    try:
        prompts = load_prompts(args.prompts)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"edge-llm bench: error: {exc}\n")
        return 2
    stats = asyncio.run(_run_cli(args, prompts))
    sys.stdout.write(format_table(stats))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([s.to_dict() for s in stats], indent=2) + "\n", encoding="utf-8")
    return 1 if any(s.errors == s.requests for s in stats) else 0


async def _run_cli(args: argparse.Namespace, prompts: list[str]) -> list[LevelStats]:
    config = BenchConfig(base_url=args.url, max_tokens=args.max_tokens, temperature=args.temperature,
                         model=args.model, api_key=args.api_key, extra_body=args.extra_body)
    if config.model is None:
        model = await discover_model(config)
        config = BenchConfig(**{**asdict(config), "model": model})
    return await run_benchmark(
        config, args.concurrency, args.requests, prompts, warmup=args.warmup, distinct=not args.repeat_prompts,
        progress_factory=lambda concurrency: ProgressBar(f"{concurrency:>3} clients"),
    )
