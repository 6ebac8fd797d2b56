"""The "real client" workload (issue 12): what the openai SDK, LangChain or an agent framework sends — no
`max_tokens`, a shared ~1,000-token system prompt, distinct questions — from 8 clients at once. Reports the
aggregate tok/s, TTFT p50/p95, the answers' lengths and how many sequences ran at once (the server's own gauge,
polled from /metrics during the run: ours `edge_llm_running_sequences`, llama-server's
`llamacpp:requests_processing`).

Sampling is a chat client's (temperature 0.7, a fixed seed), not greedy: at temperature 0 this 0.5B model
falls into repetition loops on several of the questions and, with no `max_tokens`, runs until the context is full
(thousands of tokens per answer; a run did not finish in 17 minutes). Even at 0.7 a few answers do, so each
server gets a time budget (`BUDGET_S`): no question starts after it, the streams still open are closed then, and
the tokens they sent count; the report says how many were cut."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from edge_llm.cli import bench
from edge_llm.cli.progress import ProgressBar

from .load import shared_prefix_text
from .measure import measure_quietly
from .plan import Plan
from .structured import Server

logger = logging.getLogger(__name__)

CLIENTS = 8
TEMPERATURE = 0.7
SEED = 1234
PREFIX_RULES = 26  # 1,003 tokens of system prompt with the default model
POLL_S = 0.25
BUDGET_S = 360.0
QUICK_BUDGET_S = 150.0
# llama-server's slots each hold their own copy of the system prompt: at `-c 8192` eight of them exceed the cache once
# the answers grow and it fails every request in flight. It runs a second time with this many cells.
ROOMY_PEER_CTX = 32768
ROOMY_PEER = f"llama-server -c {ROOMY_PEER_CTX}"
RUNNING_METRICS = ("edge_llm_running_sequences", "llamacpp:requests_processing")
QUESTIONS = (
    "Which rules are about naming? Quote them.",
    "Summarize rule 3 and explain why it matters.",
    "How many rules mention tests, and what do they ask?",
    "What does the guide say about logging? Give an example of a good log line.",
    "Which rule covers error handling? Show a short Python example that follows it.",
    "Write a short checklist for a reviewer based on the documentation rules.",
    "What is the first rule, and how would you apply it to a pull request that renames a module?",
    "Name the rules about performance and suggest how to check them in CI.",
    "Which rules talk about security? Explain each in a sentence.",
    "Write a commit message for a small change to module 24 that follows the rules.",
    "What do the rules say about dependencies? Give a Python requirements example.",
    "Explain how the formatting rules could be enforced automatically.",
    "Which rule mentions case 13? What should be checked?",
    "Write a Python function that validates a release version string, following the rules on tests.",
    "What do the rules say about configuration? Suggest a config file layout.",
    "Compare the rules about reviews and releases.",
)


def running_from_metrics(text: str, names: Sequence[str] = RUNNING_METRICS) -> float | None:
    """The running-sequence gauge in a Prometheus exposition, whichever of `names` the server has."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                return float(sample.value)
    return None


async def _poll_running(url: str, stop: asyncio.Event, samples: list[float]) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        while not stop.is_set():
            try:
                value = running_from_metrics((await client.get(url + "/metrics")).text)
            except (httpx.HTTPError, ValueError):
                value = None
            if value is not None:
                samples.append(value)
            try:
                await asyncio.wait_for(stop.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass


async def _run(server: Server, prefix: str, tag: str, quick: bool) -> dict[str, Any]:
    config = bench.BenchConfig(base_url=server.url, max_tokens=None, temperature=TEMPERATURE,
                               model=server.model, system_prompt=prefix, timeout_s=900.0,
                               extra_body={"seed": SEED})
    # Distinct from an earlier try's, after the shared prefix; --quick: one question a client.
    questions = [f"[{tag}] {q}" for q in QUESTIONS[:CLIENTS if quick else None]]
    stop, samples = asyncio.Event(), []
    poller = asyncio.create_task(_poll_running(server.url, stop, samples))
    try:
        stats = await bench.run_level(config, CLIENTS, len(questions), questions,
                                      ProgressBar(f"{server.name} real client"),
                                      time_budget_s=QUICK_BUDGET_S if quick else BUDGET_S)
    finally:
        stop.set()
        await poller
    return {**stats.to_dict(), **running_summary(samples)}


def running_summary(samples: Sequence[float]) -> dict[str, Any]:
    busy = [s for s in samples if s > 0]
    return {"running_max": max(samples) if samples else None,
            "running_mean_while_busy": statistics.fmean(busy) if busy else None,
            "running_samples": len(samples)}


def warm_prefix(server: Server, prefix: str) -> None:
    """One short request with the system prompt: the clients of a real deployment find it seen before."""
    config = bench.BenchConfig(base_url=server.url, max_tokens=1, model=server.model, system_prompt=prefix)
    asyncio.run(bench.run_level(config, 1, 1, ["Ready?"]))


def run_real_client(servers: Sequence[Server], plan: Plan) -> dict[str, Any]:
    prefix = shared_prefix_text(PREFIX_RULES)
    pids = [s.pid for s in servers]
    results: dict[str, Any] = {}
    for server in servers:
        if server.model is None:
            server.model = asyncio.run(bench.discover_model(bench.BenchConfig(base_url=server.url)))
        warm_prefix(server, prefix)
        results[server.name] = measure_quietly(
            f"{server.name} real client", lambda attempt, s=server: asyncio.run(_run(s, prefix, f"t{attempt}", plan.quick)),
            pids, plan)
        level = results[server.name]
        logger.info("%s real client: %.1f tok/s aggregate, %s running at most", server.name,
                    level["aggregate_tokens_per_s"], level["running_max"])
    return results
