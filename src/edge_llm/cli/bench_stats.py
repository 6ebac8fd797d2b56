"""The load generator's measuring (pure): one stream's events → a `StreamResult`, a level's streams → its
`LevelStats` (definitions in `edge_llm.cli.bench`). The HTTP side and the command are in `bench`."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


# ---- one stream: recording (pure) -------------------------------------------------------------


@dataclass
class StreamResult:
    """What one streamed request did; times are seconds on the monotonic clock."""

    started: float
    ended: float = 0.0
    content_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    server_decode_s: float | None = None  # the decode time the server reported (its last chunk's `timings`)
    error: str | None = None
    cut: bool = False  # closed by the client at the level's time budget, before the answer ended

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def completion_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.content_times)

    @property
    def ttft(self) -> float | None:
        return self.content_times[0] - self.started if self.content_times else None


class StreamRecorder:
    """Feeds the events of one chat-completions stream into a `StreamResult`."""

    def __init__(self, started: float) -> None:
        self.result = StreamResult(started=started)
        self.done = False

    def feed_data(self, data: str, now: float) -> None:
        """The data of one SSE event: a JSON chunk or `[DONE]`."""
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.result.error = f"invalid JSON in stream: {data[:80]!r}"
            return
        self.feed_chunk(chunk, now)

    def feed_chunk(self, chunk: Any, now: float) -> None:
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            self.result.error = error_message(chunk["error"])
            return
        if chunk_content(chunk) or chunk_tool_calls(chunk):
            self.result.content_times.append(now)
        tokens = usage_completion_tokens(chunk)
        if tokens is not None:
            self.result.usage_tokens = tokens
        decode = server_decode_seconds(chunk)
        if decode is not None:
            self.result.server_decode_s = decode

    def finish(self, now: float) -> StreamResult:
        self.result.ended = now
        if self.result.error is None and not self.done and not self.result.cut:
            self.result.error = "stream ended without [DONE]"
        return self.result


def chunk_content(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def chunk_tool_calls(chunk: dict[str, Any]) -> bool:
    """Whether the chunk's first choice carries a tool-call delta (output, though not `content`)."""
    choices = chunk.get("choices") or []
    delta = choices[0].get("delta") if choices and isinstance(choices[0], dict) else None
    return isinstance(delta, dict) and bool(delta.get("tool_calls"))


def server_decode_seconds(chunk: dict[str, Any]) -> float | None:
    """The decode time in a chunk's `timings`: edge-llm's `decode_ms` or llama-server's `predicted_ms`."""
    timings = chunk.get("timings")
    if not isinstance(timings, dict):
        return None
    value = timings.get("decode_ms", timings.get("predicted_ms"))
    return float(value) / 1000 if isinstance(value, (int, float)) else None


def usage_completion_tokens(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])
    return None


def error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


# ---- statistics (pure) -----------------------------------------------------------------------


def percentile(values: Sequence[float], q: int) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (statistics.quantiles' inclusive
    method; 0 and 100 are the least and the greatest); None if empty."""
    if not values:
        return None
    if len(values) < 2 or q in (0, 100):  # (quantiles needs two values, and gives the cut points 1..99)
        return min(values) if q == 0 else max(values) if q == 100 else values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def inter_token_latencies(result: StreamResult) -> list[float]:
    times = result.content_times
    return [later - earlier for earlier, later in zip(times, times[1:])]


def stream_tokens_per_second(result: StreamResult) -> float | None:
    """Decode speed of one stream: tokens after the first / time from first to last content chunk."""
    times = result.content_times
    if len(times) < 2 or result.completion_tokens < 2:
        return None
    span = times[-1] - times[0]
    return (result.completion_tokens - 1) / span if span > 0 else None


def server_decode_tokens_per_second(result: StreamResult) -> float | None:
    """Tokens after the first / the decode time the server reported, None when it reported none."""
    decode = result.server_decode_s
    if decode is None or decode <= 0 or result.completion_tokens < 2:
        return None
    return (result.completion_tokens - 1) / decode


@dataclass(frozen=True)
class LevelStats:
    concurrency: int
    requests: int
    errors: int
    completion_tokens: int
    wall_time_s: float
    aggregate_tokens_per_s: float
    ttft_median_s: float | None
    ttft_p95_s: float | None
    itl_median_s: float | None
    itl_p95_s: float | None
    stream_tokens_per_s_median: float | None
    stream_tokens_per_s_p5: float | None
    usage_reported: bool
    error_samples: tuple[str, ...] = ()
    server_decode_tokens_per_s_median: float | None = None
    cut_at_budget: int = 0  # streams the client closed at the level's time budget (their tokens so far count)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["error_samples"] = list(self.error_samples)
        return data


def summarize_level(concurrency: int, results: Sequence[StreamResult], wall_time_s: float) -> LevelStats:
    good = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    ttfts = [t for r in good if (t := r.ttft) is not None]
    itls = [gap for r in good for gap in inter_token_latencies(r)]
    speeds = [s for r in good if (s := stream_tokens_per_second(r)) is not None]
    tokens = sum(r.completion_tokens for r in good)
    return LevelStats(
        concurrency=concurrency,
        requests=len(results),
        errors=len(failed),
        completion_tokens=tokens,
        wall_time_s=wall_time_s,
        aggregate_tokens_per_s=tokens / wall_time_s if wall_time_s > 0 else 0.0,
        ttft_median_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95),
        itl_median_s=percentile(itls, 50),
        itl_p95_s=percentile(itls, 95),
        stream_tokens_per_s_median=percentile(speeds, 50),
        stream_tokens_per_s_p5=percentile(speeds, 5),
        usage_reported=bool(good) and all(r.usage_tokens is not None for r in good if not r.cut),
        error_samples=tuple(sorted({r.error or "" for r in failed}))[:3],
        server_decode_tokens_per_s_median=percentile(
            [s for r in good if (s := server_decode_tokens_per_second(r)) is not None], 50),
        cut_at_budget=sum(r.cut for r in results),
    )


def level_wall_time(results: Sequence[StreamResult]) -> float:
    """From the first request sent to the last one ended."""
    if not results:
        return 0.0
    return max(r.ended for r in results) - min(r.started for r in results)
