"""Deterministic mode (issue 18): ours by default against ours with `--deterministic`, both `--parallel 8
--cache-slots 8 --ctx-size 32768` (with `--deterministic` a KV stream of 2,048 cells each).

At 1, 4 and 8 clients, each server in turn (a paired design), the clients send requests from one seeded list: load
(varied prompts, some sharing the probes' system prompt, varied lengths and temperatures) with a probe every
second request. A probe is one of two fixed bodies, greedy or seeded at temperature 1, half of them with
`cache_prompt: false` (cold), the others finding their prompt, and earlier answers, in the prefix cache. Reported:
the distinct answers of each probe on each server (the goal: 1 in 200 with `--deterministic`), and each level's
aggregate completion tokens per second (every request, over the level's wall time), deterministic / default."""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
from typing import Any

import httpx

from .measure import measure_quietly
from .plan import Plan
from .report import fmt, pct, target

logger = logging.getLogger(__name__)

DEFAULT, DETERMINISTIC = "ours default", "ours --deterministic"
SERVER_FLAGS = ("--cache-slots", "8", "--ctx-size", "32768")
LEVELS = {1: 40, 4: 120, 8: 240}  # clients → requests, half of them probes: 200 probes a server
QUICK_LEVELS = {1: 12, 4: 32, 8: 56}
SEED = 18
SYSTEM = ("You are a careful assistant for a team that maintains a large Python code base. Answer precisely and "
          "prefer short, idiomatic examples.")
PROBE_QUESTION = "Explain how a hash map handles collisions, with a short Python example."
PROBES = {
    "greedy": {"temperature": 0},
    "seeded": {"temperature": 1.0, "top_p": 0.95, "seed": 20261201},
}
PROBE_TOKENS = 32
SUBJECTS = ("binary search", "a lighthouse", "Python's GIL", "the moon", "unit tests", "rain in April",
            "a red-black tree", "a small bakery", "TCP handshakes", "list comprehensions")


def requests_for(count: int) -> list[dict[str, Any]]:
    """The level's requests in order: load and probes alternating (the same list on both servers)."""
    rng = random.Random(SEED * 1000 + count)
    chosen: list[dict[str, Any]] = []
    for n in range(count):
        if n % 2:
            kind = "greedy" if n % 4 == 1 else "seeded"
            body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROBE_QUESTION}],
                    "max_tokens": PROBE_TOKENS, **PROBES[kind], "cache_prompt": n % 8 >= 4}
            chosen.append({"probe": kind, "body": body})
            continue
        system = SYSTEM if rng.random() < 0.5 else f"You answer questions about {rng.choice(SUBJECTS)}."
        question = f"Tell me about {rng.choice(SUBJECTS)} and {rng.choice(SUBJECTS)}."
        body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                "max_tokens": rng.randint(16, 64), "temperature": rng.choice([0, 0.7, 1.0])}
        chosen.append({"probe": None, "body": body})
    return chosen


def run_level(url: str, clients: int, chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """`clients` threads take the requests in order; returns the probes' answers and the aggregate rate."""
    queue = list(enumerate(chosen))
    lock = threading.Lock()
    answers: dict[str, list[str]] = {kind: [] for kind in PROBES}
    tokens = [0]

    def client() -> None:
        with httpx.Client(timeout=600) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    _, item = queue.pop(0)
                response = http.post(url + "/v1/chat/completions", json=item["body"])
                response.raise_for_status()
                data = response.json()
                with lock:
                    tokens[0] += data["usage"]["completion_tokens"]
                    if item["probe"]:
                        answers[item["probe"]].append(data["choices"][0]["message"]["content"])

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    elapsed = time.perf_counter() - started
    return {"requests": len(chosen), "answers": answers, "completion_tokens": tokens[0], "seconds": elapsed,
            "aggregate_tok_s": tokens[0] / elapsed}


def run_determinism(found: dict[str, tuple[str, int]], plan: Plan, checkpoint: Any) -> dict[str, Any]:
    """Every level on both servers, one right after the other; `checkpoint(runs)` after each."""
    runs: dict[str, Any] = {}
    for clients, count in (QUICK_LEVELS if plan.quick else LEVELS).items():
        chosen = requests_for(count)
        for name, (url, pid) in found.items():
            logger.info("determinism: %s, %d clients, %d requests", name, clients, count)
            runs.setdefault(name, {})[str(clients)] = measure_quietly(
                f"determinism {name} {clients}", lambda _attempt, url=url: run_level(url, clients, chosen), [pid],
                plan)
            checkpoint(runs)
    return runs


def distinct(runs: dict[str, Any], server: str, kind: str) -> tuple[int, int]:
    """(distinct answers, probes) of one probe kind over all levels of one server."""
    answers = [a for level in runs.get(server, {}).values() for a in level["answers"][kind]]
    return len(set(answers)), len(answers)


def determinism_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    runs = results.get("runs", {})
    checks = []
    total_distinct = total_probes = 0
    for kind in PROBES:
        count, probes = distinct(runs, DETERMINISTIC, kind)
        total_distinct, total_probes = total_distinct + count, total_probes + probes
    if total_probes:
        checks.append(target(f"--deterministic: distinct answers per probe over {total_probes} probes",
                             total_distinct / len(PROBES), "<=", 1.0, []))
    for clients in runs.get(DETERMINISTIC, {}):
        det, base = runs[DETERMINISTIC][clients], runs.get(DEFAULT, {}).get(clients)
        if base:
            checks.append(target(f"--deterministic aggregate tok/s / default, {clients} clients",
                                 det["aggregate_tok_s"] / base["aggregate_tok_s"], ">=", 0.85, [det, base]))
    return checks


def determinism_markdown(results: dict[str, Any]) -> str:
    meta, runs = results["meta"], results.get("runs", {})
    lines = [f"# Deterministic mode ({meta['date']}, commit {meta['commit']})", "",
             f"{meta['model']}, {meta['threads']} threads; both servers `--parallel 8 {' '.join(SERVER_FLAGS)}`; "
             f"probes of {PROBE_TOKENS} tokens, half cold (`cache_prompt: false`); `benchmarks/suite/determinism.py`.",
             "", "| server | clients | requests | greedy distinct | seeded distinct | aggregate tok/s | vs default | "
             "other processes |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for server in (DEFAULT, DETERMINISTIC):
        for clients, level in runs.get(server, {}).items():
            base = runs.get(DEFAULT, {}).get(clients)
            ratio = level["aggregate_tok_s"] / base["aggregate_tok_s"] if base and server != DEFAULT else None
            kinds = [f"{len(set(level['answers'][k]))} of {len(level['answers'][k])}" for k in PROBES]
            lines.append(f"| {server} | {clients} | {level['requests']} | "
                         f"{kinds[0]} | {kinds[1]} | {fmt(level['aggregate_tok_s'])} | "
                         f"{fmt(ratio, digits=2) if ratio else '–'} | {pct(level.get('neighbour_cpu'))} |")
    lines += ["", "Over all levels:", ""]
    for server in (DEFAULT, DETERMINISTIC):
        parts = [f"{kind} {distinct(runs, server, kind)[0]} distinct of {distinct(runs, server, kind)[1]}"
                 for kind in PROBES]
        lines.append(f"- {server}: " + ", ".join(parts))
    lines += ["", "| check | value | target | pass |", "|---|---:|---|---|"]
    for check in results.get("targets", []):
        verdict = "–" if check["pass"] is None else ("yes" if check["pass"] else "**no**")
        lines.append(f"| {check['check']} | {fmt(check['ratio'], digits=3)} | {check['target']} | {verdict} |")
    return "\n".join(lines) + "\n"

