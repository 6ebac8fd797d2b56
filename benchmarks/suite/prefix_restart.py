"""`--only prefix-restart` (issue 21): time to first token for a request sharing a ~900-token prefix with one served
before a restart, with the persistent prefix cache (`--prefix-cache-dir`), against the same request warm (the
prefix in the in-memory cache) and cold (nothing cached).

Per round (a prefix of its own): a cold request, then a warm one (another question, same prefix) on the first
server; after a restart, the first request of that prefix (loaded from disk) and a warm one again. TTFT is measured
by the client: from sending a streamed request to its first content token. The engine thread's own costs come from
the server's log: the state copy of each save and each load (read, checksum, into the KV).
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from edge_llm.testing.server import run_server

from .load import shared_prefix_text
from .plan import RESULTS, THREADS, Plan

logger = logging.getLogger(__name__)

QUESTIONS = ("Which rule is about naming?", "Summarize rule 3 in one sentence.", "What is the first rule?",
             "Which rule covers error handling?")
COPY = re.compile(r"saving a prefix of (\d+) tokens \(([\d.]+) MiB\); state copied in ([\d.]+) ms")
LOAD = re.compile(r"loaded a saved prefix of (\d+) tokens \((\d+) shared\) in ([\d.]+) ms")


def prefix(round_index: int) -> str:
    return f"Team {round_index + 1} of {'ABCDEFGH'[round_index]}-street. " + shared_prefix_text(24)


def ttft(url: str, system: str, question: str) -> dict[str, float]:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = None
    cached = prompt = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                prompt = chunk["usage"]["prompt_tokens"]
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return {"ttft_s": (first or time.perf_counter()) - started, "prompt_tokens": prompt, "cached_tokens": cached}


def warm_up(url: str) -> None:
    """A short request first, so that no figure carries the first decode's one-time costs."""
    httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
               timeout=300)


def engine_costs(log: str) -> dict[str, Any]:
    copies = [{"tokens": int(m[1]), "mib": float(m[2]), "ms": float(m[3])} for m in COPY.finditer(log)]
    loads = [{"tokens": int(m[1]), "shared": int(m[2]), "ms": float(m[3])} for m in LOAD.finditer(log)]
    return {"copies": copies, "loads": loads}


def run_prefix_restart(model: Path, plan: Plan) -> dict[str, Any]:
    rounds = 2 if plan.quick else 4
    results: dict[str, Any] = {"rounds": []}
    with tempfile.TemporaryDirectory(prefix="edge-llm-prefix-") as directory:
        flags = ("--parallel", "4", "--log-level", "info", "--log-format", "text", "--prefix-cache-dir", directory)
        with run_server(RESULTS, *flags, model=model, threads=THREADS, startup_timeout=300,
                        log_name="prefix-restart-1.log") as server:
            warm_up(server.url)
            for r in range(rounds):
                cold = ttft(server.url, prefix(r), QUESTIONS[0])
                warm = ttft(server.url, prefix(r), QUESTIONS[1])
                results["rounds"].append({"cold": cold, "warm": warm})
            deadline = time.monotonic() + 120
            while len(list(Path(directory).glob("*.kv"))) < rounds and time.monotonic() < deadline:
                time.sleep(0.2)  # the writer thread finishing its saves
            before = engine_costs(server.log())
        results["saved_entries"] = len(list(Path(directory).glob("*.kv")))
        results["disk_bytes"] = sum(p.stat().st_size for p in Path(directory).glob("*.kv"))
        with run_server(RESULTS, *flags, model=model, threads=THREADS, startup_timeout=300,
                        log_name="prefix-restart-2.log") as server:
            warm_up(server.url)
            for r in range(rounds):
                results["rounds"][r]["after_restart"] = ttft(server.url, prefix(r), QUESTIONS[2])
                results["rounds"][r]["warm_after_restart"] = ttft(server.url, prefix(r), QUESTIONS[3])
            after = engine_costs(server.log())
    results["copies"] = before["copies"]
    results["loads"] = after["loads"]
    summary: dict[str, Any] = {}
    for phase in ("cold", "warm", "after_restart", "warm_after_restart"):
        summary[phase + "_ttft_s"] = statistics.median(r[phase]["ttft_s"] for r in results["rounds"])
    warm_all = [r[p]["ttft_s"] for r in results["rounds"] for p in ("warm", "warm_after_restart")]
    summary["warm_ttft_s_all"] = statistics.median(warm_all)
    summary["restart_over_warm"] = summary["after_restart_ttft_s"] / summary["warm_ttft_s_all"]
    summary["cold_over_warm"] = summary["cold_ttft_s"] / summary["warm_ttft_s_all"]
    summary["copy_ms_median"] = statistics.median(c["ms"] for c in results["copies"]) if results["copies"] else None
    summary["load_ms_median"] = statistics.median(c["ms"] for c in results["loads"]) if results["loads"] else None
    summary["goal_met"] = summary["restart_over_warm"] <= 2.0
    results["summary"] = summary
    return results


def prefix_restart_markdown(results: dict[str, Any]) -> str:
    meta, summary = results["meta"], results["summary"]
    first = results["rounds"][0]
    lines = [
        "# The persistent prefix cache across a restart (`--only prefix-restart`)",
        "",
        f"{meta['date']}, {meta['model']}, {meta['threads']} threads, commit {meta['commit']}; "
        f"{len(results['rounds'])} rounds, each a prompt of {first['cold']['prompt_tokens']} tokens sharing a "
        f"~900-token system prompt; `--parallel 4 --prefix-cache-dir DIR`. TTFT measured by the client (streamed).",
        "",
        "| | TTFT (median) | cached tokens (round 1) |",
        "|---|---|---|",
        f"| cold (nothing cached) | {summary['cold_ttft_s'] * 1000:.0f} ms | {first['cold']['cached_tokens']} |",
        f"| warm (in-memory prefix cache) | {summary['warm_ttft_s'] * 1000:.0f} ms | {first['warm']['cached_tokens']} |",
        f"| **after a restart (loaded from disk)** | **{summary['after_restart_ttft_s'] * 1000:.0f} ms** "
        f"| {first['after_restart']['cached_tokens']} |",
        f"| warm after the restart | {summary['warm_after_restart_ttft_s'] * 1000:.0f} ms "
        f"| {first['warm_after_restart']['cached_tokens']} |",
        "",
        f"After a restart / warm: **{summary['restart_over_warm']:.2f}×** (goal ≤ 2×: "
        f"{'met' if summary['goal_met'] else 'not met'}); cold / warm: {summary['cold_over_warm']:.1f}×.",
        f"Engine thread: a save's state copy {summary['copy_ms_median'] or 0:.1f} ms (median of "
        f"{len(results['copies'])}), a load (read, checksum, into the KV) {summary['load_ms_median'] or 0:.1f} ms "
        f"(median of {len(results['loads'])}); load average {meta.get('loadavg_before', 0):.1f} before, "
        f"{meta.get('loadavg_after', 0):.1f} after; "
        f"{results['saved_entries']} entries, {results['disk_bytes'] / 2**20:.1f} MiB on disk.",
    ]
    return "\n".join(lines) + "\n"
