"""(b), (c), (d): load against a running server with the load generator of `edge-llm bench`
(edge_llm.cli.bench): client levels repeated between raw measurements, and the shared-prefix series."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from edge_llm.cli import bench
from edge_llm.cli.progress import ProgressBar

from .measure import measure_quietly
from .plan import CLIENT_LEVELS, NEW_TOKENS, PREFIX_QUESTIONS, Plan
from .raw import RawLoop

logger = logging.getLogger(__name__)


def shared_prefix_text(rules: int = 24) -> str:
    """A system prompt of distinct, numbered rules: 926 tokens with 24 of them (the default model), ~38 a rule."""
    topics = ("naming", "tests", "logging", "error handling", "documentation", "performance", "security",
              "dependencies", "formatting", "reviews", "releases", "configuration")
    rules = [
        f"Rule {i + 1}: when you work on {topics[i % len(topics)]} in module number {i * 7 + 3}, keep each "
        f"change small, explain the reason for it, and check case {i * 13 % 97} before you finish."
        for i in range(rules)
    ]
    return "You are the code-review assistant of a small team. Follow these house rules.\n" + "\n".join(rules)


def full_length_body(end_tokens: Sequence[int]) -> dict[str, Any]:
    """Request fields that ban the end-of-generation tokens (OpenAI `logit_bias`, -100 bans), so that every
    answer runs to max_tokens like the raw loop's sequences; both servers get the same body."""
    return {"logit_bias": {str(t): -100 for t in end_tokens}}


@dataclass
class LoadTarget:
    """A running server under test, with its bench settings and what was measured on it."""

    name: str
    pid: int
    config: bench.BenchConfig
    repeats: dict[int, list[dict[str, Any]]]


def prepare_target(name: str, base_url: str, pid: int, plan: Plan, extra_body: dict[str, Any]) -> LoadTarget:
    """Discovers the model id and sends the warm-up requests."""
    config = bench.BenchConfig(base_url=base_url, max_tokens=NEW_TOKENS, temperature=0.0)
    config = bench.BenchConfig(base_url=base_url, max_tokens=NEW_TOKENS, temperature=0.0,
                               model=asyncio.run(bench.discover_model(config)), extra_body=extra_body)
    if plan.warmup:
        asyncio.run(bench.run_level(config, 1, plan.warmup, list(bench.DEFAULT_PROMPTS), tag="warmup"))
    return LoadTarget(name, pid, config, {clients: [] for clients in CLIENT_LEVELS})


def measure_level(target: LoadTarget, clients: int, repeat: int, plan: Plan) -> None:
    def one_level(attempt: int) -> dict[str, Any]:
        bar = ProgressBar(f"{target.name} {clients:>2} clients")
        # Tagged: every request of the run has its own prompt (the same ones for ours and the peer).
        tag = f"c{clients}r{repeat}t{attempt}"
        level = bench.run_level(target.config, clients, plan.requests_for(clients), list(bench.DEFAULT_PROMPTS),
                                bar, tag=tag)
        return asyncio.run(level).to_dict()

    target.repeats[clients].append(measure_quietly(f"{target.name} {clients} clients", one_level, [target.pid], plan))


def run_levels(raw: RawLoop, targets: Sequence[LoadTarget], plan: Plan) -> None:
    """For each client count: raw, then every server, repeated, then raw once more (a paired design)."""
    for clients in CLIENT_LEVELS:
        for repeat in range(plan.level_repeats):
            raw.measure(clients)
            for target in targets:
                measure_level(target, clients, repeat, plan)
        raw.measure(clients)


def target_results(target: LoadTarget, plan: Plan, prefix: str) -> dict[str, Any]:
    """Every level (the table shows the repeat of median aggregate throughput) and the shared-prefix series."""
    levels = []
    for clients, repeats in target.repeats.items():
        middle = sorted(repeats, key=lambda r: r["aggregate_tokens_per_s"])[len(repeats) // 2]
        levels.append({**middle, "repeats": repeats})
    # Not repeated: a second try would find the prefix cached.
    shared = measure_quietly(f"{target.name} shared prefix",
                             lambda _: asyncio.run(shared_prefix(target.config, plan, prefix)), [target.pid],
                             replace(plan, attempts=1))
    logger.info("%s: %s", target.name, ", ".join(
        f"{lv['concurrency']} clients {lv['aggregate_tokens_per_s']:.1f} tok/s" for lv in levels))
    return {"model": target.config.model, "levels": levels, "shared_prefix": shared}


async def shared_prefix(config: bench.BenchConfig, plan: Plan, prefix: str) -> dict[str, Any]:
    prefixed = bench.BenchConfig(base_url=config.base_url, max_tokens=plan.prefix_max_tokens, temperature=0.0,
                                 model=config.model, system_prompt=prefix)
    results = []
    async with bench.new_client(prefixed, 1) as client:
        for question in PREFIX_QUESTIONS[: plan.prefix_requests]:
            results.append(await bench.stream_chat(client, prefixed, question))
    ttfts = [r.ttft for r in results]
    later = [t for t in ttfts[1:] if t is not None]
    return {
        "requests": len(results),
        "errors": sum(not r.ok for r in results),
        "ttft_s": ttfts,
        "first_ttft_s": ttfts[0],
        "later_ttft_median_s": statistics.median(later) if later else None,
    }
