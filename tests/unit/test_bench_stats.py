"""The load generator's measuring and statistics: pure functions, and one stream read from a mock server."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from edge_llm.cli.bench import (
    BenchConfig,
    chat_url,
    format_table,
    load_prompts,
    models_url,
    parse_extra_body,
    parse_levels,
    request_prompt,
    stream_chat,
)
from edge_llm.cli.bench_stats import (
    StreamRecorder,
    StreamResult,
    inter_token_latencies,
    level_wall_time,
    percentile,
    server_decode_tokens_per_second,
    stream_tokens_per_second,
    summarize_level,
)
from edge_llm.cli.progress import ProgressBar


def content_data(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def usage_data(completion_tokens: int) -> str:
    return json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens}})


def record(events: list[tuple[float, str]], started: float = 0.0, ended: float = 10.0) -> StreamResult:
    """Feeds (time, data of one event) pairs."""
    recorder = StreamRecorder(started)
    for now, data in events:
        recorder.feed_data(data, now)
    return recorder.finish(ended)


def stream(started: float, times: list[float], usage: int | None = None, ended: float | None = None) -> StreamResult:
    return StreamResult(started=started, ended=ended if ended is not None else (times[-1] if times else started),
                        content_times=list(times), usage_tokens=usage)


# ---- percentile ------------------------------------------------------------------------------


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 50) is None


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([3.0], 50) == 3.0
    assert percentile([3.0], 95) == 3.0


def test_median_interpolates_between_the_middle_values() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0


def test_p95_interpolates_linearly_between_closest_ranks() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20: rank 0.95 * 19 = 18.05
    assert percentile(values, 95) == pytest.approx(19.05)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 20.0


# ---- recording one stream --------------------------------------------------------------------


def test_recorder_times_only_chunks_with_content() -> None:
    result = record([
        (0.5, json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]})),
        (1.0, content_data("Hel")),
        (1.5, content_data("lo")),
        (1.6, json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]})),
        (1.7, "[DONE]"),
    ])
    assert result.ok
    assert result.content_times == [1.0, 1.5]
    assert result.ttft == pytest.approx(1.0)
    assert result.usage_tokens is None
    assert result.completion_tokens == 2  # fallback: the count of content chunks


def test_recorder_prefers_the_usage_chunk_over_the_chunk_count() -> None:
    result = record([(1.0, content_data("ab")), (2.0, content_data("cd")), (2.1, usage_data(4)), (2.2, "[DONE]")])
    assert result.usage_tokens == 4
    assert result.completion_tokens == 4


def test_recorder_records_an_error_event() -> None:
    error = {"error": {"message": "the request queue is full", "type": "server_error"}}
    result = record([(1.0, json.dumps(error)), (1.1, "[DONE]")])
    assert not result.ok
    assert result.error == "the request queue is full"


def test_a_tool_call_delta_is_output_and_the_server_decode_time_is_read_from_timings() -> None:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ours = record([
        (2.0, json.dumps({"choices": [{"delta": {"tool_calls": [call]}}]})),
        (2.1, json.dumps({"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "timings": {"decode_ms": 1500}})),
        (2.2, usage_data(31)),
        (2.3, "[DONE]"),
    ])
    assert ours.content_times == [2.0]
    assert ours.server_decode_s == pytest.approx(1.5)
    assert server_decode_tokens_per_second(ours) == pytest.approx(20.0)  # 30 tokens after the first
    peer = record([(1.0, content_data("a")), (1.5, json.dumps({"choices": [], "usage": {"completion_tokens": 11},
                                                               "timings": {"predicted_ms": 500.0}})), (1.6, "[DONE]")])
    assert server_decode_tokens_per_second(peer) == pytest.approx(20.0)
    assert server_decode_tokens_per_second(record([(1.0, content_data("a")), (1.1, "[DONE]")])) is None


def test_a_stream_without_done_is_an_error() -> None:
    result = record([(1.0, content_data("a"))])
    assert result.error == "stream ended without [DONE]"


def read_stream(*chunks: bytes, status: int = 200, content_type: str = "text/event-stream") -> StreamResult:
    """stream_chat against a mock server that sends `chunks` (split anywhere, as a network may)."""
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"content-type": content_type}, content=body())

    async def run() -> StreamResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await stream_chat(client, BenchConfig("http://bench.test"), "hi")

    return asyncio.run(run())


def test_a_stream_is_read_event_by_event_and_comments_are_ignored() -> None:
    stream = (f": keep-alive\n\ndata: {content_data('a')}\n\n: keep-alive\n\ndata:{content_data('b')}\n\n"
              f"data: {usage_data(2)}\n\ndata: [DONE]\n\n").encode()
    result = read_stream(stream[:5], stream[5:50], stream[50:])
    assert result.ok, result.error
    assert len(result.content_times) == 2 and result.usage_tokens == 2


def test_a_stream_still_open_at_the_deadline_is_closed_and_counted_as_cut() -> None:
    closed = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield f"data: {content_data('a')}\n\ndata: {content_data('b')}\n\n".encode()
            await asyncio.Event().wait()  # an answer that never ends
        finally:
            closed.append(True)

    async def run() -> StreamResult:
        transport = httpx.MockTransport(lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body()))
        async with httpx.AsyncClient(transport=transport) as client:
            loop = asyncio.get_running_loop()
            return await stream_chat(client, BenchConfig("http://bench.test"), "hi", deadline=loop.time() + 0.2)

    result = asyncio.run(run())
    assert result.ok and result.cut and closed == [True]
    assert result.completion_tokens == 2
    level = summarize_level(1, [result, stream(0.0, [1.0, 2.0], usage=2)], 3.0)
    assert level.cut_at_budget == 1 and level.completion_tokens == 4 and level.usage_reported


def test_refusals_and_replies_that_are_not_streams_are_recorded_errors() -> None:
    assert read_stream(b"busy", status=503, content_type="text/plain").error == "HTTP 503: busy"
    assert (read_stream(b"{}", content_type="application/json").error or "").startswith("SSEError")
    assert read_stream(b"data: {nope\n\ndata: [DONE]\n\n").error == "invalid JSON in stream: '{nope'"


# ---- per-stream measures ----------------------------------------------------------------------


def test_inter_token_latencies_are_the_gaps_between_content_chunks() -> None:
    assert inter_token_latencies(stream(0.0, [1.0, 1.1, 1.3])) == pytest.approx([0.1, 0.2])
    assert inter_token_latencies(stream(0.0, [1.0])) == []


def test_stream_speed_excludes_the_first_token_and_uses_usage() -> None:
    # 5 tokens reported, content chunks from t=1 to t=2: 4 tokens decoded in 1 s.
    assert stream_tokens_per_second(stream(0.0, [1.0, 1.5, 2.0], usage=5)) == pytest.approx(4.0)
    assert stream_tokens_per_second(stream(0.0, [1.0, 1.5, 2.0])) == pytest.approx(2.0)
    assert stream_tokens_per_second(stream(0.0, [1.0])) is None


# ---- a level ---------------------------------------------------------------------------------------


def test_summarize_level_aggregates_over_the_wall_time() -> None:
    results = [
        stream(0.0, [0.5, 0.6, 0.7], usage=3, ended=0.8),
        stream(0.0, [1.0, 1.2, 1.4, 1.6], usage=4, ended=1.7),
        StreamResult(started=0.1, ended=0.2, error="HTTP 503: busy"),
    ]
    wall = level_wall_time(results)
    assert wall == pytest.approx(1.7)
    stats = summarize_level(2, results, wall)
    assert stats.requests == 3
    assert stats.errors == 1
    assert stats.completion_tokens == 7
    assert stats.aggregate_tokens_per_s == pytest.approx(7 / 1.7)
    assert stats.ttft_median_s == pytest.approx(0.75)
    assert stats.itl_median_s == pytest.approx(0.2)  # gaps 0.1, 0.1, 0.2, 0.2, 0.2
    assert stats.stream_tokens_per_s_median == pytest.approx(7.5)  # 10 tok/s and 5 tok/s
    assert stats.usage_reported
    assert stats.error_samples == ("HTTP 503: busy",)
    assert stats.to_dict()["error_samples"] == ["HTTP 503: busy"]


def test_summarize_level_with_only_errors_has_no_latencies() -> None:
    stats = summarize_level(1, [StreamResult(started=0.0, ended=1.0, error="boom")], 1.0)
    assert stats.errors == 1
    assert stats.completion_tokens == 0
    assert stats.ttft_median_s is None
    assert stats.itl_p95_s is None
    assert not stats.usage_reported
    assert "-" in format_table([stats])


def test_level_wall_time_of_nothing_is_zero() -> None:
    assert level_wall_time([]) == 0.0
    assert summarize_level(1, [], 0.0).aggregate_tokens_per_s == 0.0


# ---- options ------------------------------------------------------------------------------------------


def test_parse_levels() -> None:
    assert parse_levels("1,4,8") == [1, 4, 8]
    assert parse_levels("2") == [2]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_levels("1,x")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_levels("0")


@pytest.mark.parametrize(
    "base",
    ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/", "http://h:1/v1/chat/completions"],
)
def test_chat_url_accepts_a_base_url_or_the_endpoint(base: str) -> None:
    assert chat_url(base) == "http://h:1/v1/chat/completions"
    assert models_url(base) == "http://h:1/v1/models"


def test_request_body_streams_with_usage() -> None:
    body = BenchConfig("http://h", max_tokens=8, model="m", system_prompt="sys").body("hi")
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0
    assert body["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert "model" not in BenchConfig("http://h").body("hi")


def test_without_max_tokens_the_body_has_none() -> None:
    assert "max_tokens" not in BenchConfig("http://h", max_tokens=None).body("hi")
    assert BenchConfig("http://h").body("hi")["max_tokens"] == 64


def test_extra_body_is_merged_into_every_request() -> None:
    extra = parse_extra_body('{"logit_bias": {"151645": -100}, "max_tokens": 3}')
    body = BenchConfig("http://h", max_tokens=8, extra_body=extra).body("hi")
    assert body["logit_bias"] == {"151645": -100}
    assert body["max_tokens"] == 3  # the extra body wins
    for bad in ("[1]", "{nope"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_extra_body(bad)


def test_load_prompts(tmp_path: Path) -> None:
    assert len(set(load_prompts(None))) == len(load_prompts(None)) > 4
    good = tmp_path / "p.json"
    good.write_text(json.dumps(["a", "b"]))
    assert load_prompts(good) == ["a", "b"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError):
        load_prompts(bad)


def test_request_prompts_cycle_and_are_made_unique_by_the_tag() -> None:
    prompts = ["a", "b"]
    assert [request_prompt(prompts, i, None) for i in range(3)] == ["a", "b", "a"]
    tagged = [request_prompt(prompts, i, "c4") for i in range(4)]
    assert tagged == ["[c4-0] a", "[c4-1] b", "[c4-2] a", "[c4-3] b"]
    assert request_prompt(prompts, 0, "c1") != request_prompt(prompts, 0, "c4")


# ---- the progress bar (edge_llm.cli.progress, shared with `edge-llm model fetch`) ----------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_a_line_every_20_percent() -> None:
    out = io.StringIO()
    bar = ProgressBar("fetch", scale=1e6, unit=" MB", stream=out)
    for done in range(0, 101_000_000, 1_000_000):
        bar(done, 100_000_000)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[1] for line in lines] == ["0%", "20%", "40%", "60%", "80%", "100%"]
    assert lines[-1].startswith("fetch: 100% 100/100 MB ") and "\r" not in out.getvalue()


def test_progress_on_a_terminal_is_redrawn_and_ends_its_line_once() -> None:
    out = Terminal()
    bar = ProgressBar("  4 clients", width=10, stream=out)
    for done in range(1, 5):
        bar(done, 4)
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "\r  4 clients [##########] 100% 4/4 " in text
