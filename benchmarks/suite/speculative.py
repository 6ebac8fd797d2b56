"""Speculative decoding (issue 17): ours with `--speculative off` against `--speculative ngram`, and llama.cpp's
llama-server with `--spec-type ngram-simple` beside, on code edits (a ~45-line Python file sent back whole with a
variable renamed, type hints or docstrings added), free prose, JSON written freely and the same JSON under a
`response_format` JSON schema (drafts checked by the grammar), at 1 and 4 clients (and 8 for prose), greedy.

Each level runs on the three servers one right after the other (a paired design); a request is a non-streamed chat
completion whose server-side `timings` give its decode rate. Ratios, targets and Markdown are at the bottom."""

from __future__ import annotations

import concurrent.futures
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from .measure import measure_quietly
from .plan import Plan
from .report import fmt, pct, target

logger = logging.getLogger(__name__)

OFF, NGRAM, PEER = "ours off", "ours ngram", "llama-server ngram-simple"
SERVERS = (OFF, NGRAM, PEER)
PEER_FLAGS = ("--spec-type", "ngram-simple")
CODE_TOKENS, PROSE_TOKENS = 1024, 256
LEVELS = {"code": (1, 4), "prose": (1, 4, 8), "json": (1, 4), "schema": (1, 4)}
QUICK_LEVELS = {"code": (1, 4), "prose": (1,), "json": (1,), "schema": (1,)}  # --quick, for a machine shared with others

SOURCE = '''import csv
import statistics
from dataclasses import dataclass


@dataclass
class Reading:
    station: str
    day: str
    temp: float
    rain: float


def load_readings(path):
    rows = []
    with open(path, newline="") as handle:
        for record in csv.DictReader(handle):
            try:
                temp = float(record["temp"])
                rain = float(record["rain"])
            except (KeyError, ValueError):
                continue
            rows.append(Reading(record["station"], record["day"], temp, rain))
    return rows


def by_station(rows):
    groups = {}
    for row in rows:
        groups.setdefault(row.station, []).append(row)
    return groups


def summary(rows):
    result = {}
    for station, group in by_station(rows).items():
        temps = [row.temp for row in group]
        result[station] = {
            "mean": statistics.mean(temps),
            "max": max(temps),
            "rain": sum(row.rain for row in group),
        }
    return result


def wettest(rows, n=3):
    totals = summary(rows)
    return sorted(totals, key=lambda station: totals[station]["rain"], reverse=True)[:n]
'''

CODE_TASKS = (
    "Rename the variable `rows` to `readings` everywhere in this code. Reply with the whole code only.",
    "Add type hints to every function in this code. Reply with the whole code only.",
    "Add a one-line docstring to every function in this code. Reply with the whole code only.",
)
PROSE_TASKS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a busy morning market in a small mountain town.",
    "Write a letter from a traveller to a friend about crossing a desert.",
    "Tell the story of a robot that learns to paint.",
    "Describe a thunderstorm over the sea from the deck of a ship.",
    "Write a fable about a fox and a clever crow.",
    "Describe the first day of spring in a city park.",
    "Write a diary entry of an astronaut on the moon.",
)

# JSON written freely (no response_format): half its tokens repeat keys and punctuation, the rest are new values
JSON_TASKS = (
    "Fill in the staff directory of a fictional software company: its name and ten team members, each with name, "
    "age, role, city and country, three skills and whether they are active. Answer in JSON.",
    "List eight countries with their capital, population, official languages and currency. Answer in JSON.",
    "Describe six fictional books: title, author, year, genre, page count and a one-sentence summary. Answer in JSON.",
)
JSON_TOKENS = 200


def _array_of(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A `response_format` whose answer is {name: [objects with every one of `properties`]}."""
    item = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    schema = {"type": "object", "properties": {name: {"type": "array", "items": item}}, "required": [name],
              "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


_TEXT, _INT = {"type": "string"}, {"type": "integer"}
_TEXTS = {"type": "array", "items": _TEXT}
SCHEMAS = (  # one for each of JSON_TASKS
    _array_of("members", {"name": _TEXT, "age": _INT, "role": _TEXT, "city": _TEXT, "country": _TEXT,
                          "skills": _TEXTS, "active": {"type": "boolean"}}),
    _array_of("countries", {"name": _TEXT, "capital": _TEXT, "population": _INT, "languages": _TEXTS,
                            "currency": _TEXT}),
    _array_of("books", {"title": _TEXT, "author": _TEXT, "year": _INT, "genre": _TEXT, "pages": _INT,
                        "summary": _TEXT}),
)


def prompts(workload: str) -> list[tuple[str, int, dict[str, Any] | None]]:
    """(user message, max_tokens, response_format) of each task of a workload."""
    if workload == "code":
        return [(f"{task}\n\n```python\n{SOURCE}```", CODE_TOKENS, None) for task in CODE_TASKS]
    if workload == "json":
        return [(task, JSON_TOKENS, None) for task in JSON_TASKS]
    if workload == "schema":
        return [(task, JSON_TOKENS, schema) for task, schema in zip(JSON_TASKS, SCHEMAS)]
    return [(task, PROSE_TOKENS, None) for task in PROSE_TASKS]


def decode_rate(body: dict[str, Any]) -> float | None:
    """Tokens per second after the first, by the server's own timing (ours: decode_ms; llama-server: predicted_*)."""
    timings = body.get("timings") or {}
    if "decode_ms" in timings:
        tokens, ms = body["usage"]["completion_tokens"] - 1, timings["decode_ms"]
    else:
        tokens, ms = timings.get("predicted_n", 0) - 1, timings.get("predicted_ms", 0.0)
    return tokens / ms * 1000 if tokens > 0 and ms > 0 else None


def one_request(url: str, content: str, max_tokens: int, response_format: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": content}], "temperature": 0,
                            "max_tokens": max_tokens}
    if response_format is not None:
        body["response_format"] = response_format
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
    response.raise_for_status()
    answer = response.json()
    timings = answer.get("timings") or {}
    return {"tokens": answer["usage"]["completion_tokens"], "decode_tok_s": decode_rate(answer),
            "text": answer["choices"][0]["message"]["content"],
            "drafted": timings.get("draft_n"), "accepted": timings.get("draft_n_accepted")}


def run_round(url: str, workload: str, clients: int, round_index: int) -> dict[str, Any]:
    """`clients` clients sending one request each at once, client i task i + round_index × clients (in turn)."""
    tasks = prompts(workload)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda i: one_request(url, *tasks[(i + round_index * clients) % len(tasks)]),
                                range(clients)))
    wall = time.monotonic() - started
    rates = [a["decode_tok_s"] for a in answers if a["decode_tok_s"]]
    drafted = sum(a["drafted"] or 0 for a in answers)
    return {"clients": clients, "requests": len(answers), "wall_s": wall,
            "aggregate_tok_s": sum(a["tokens"] for a in answers) / wall,
            "decode_tok_s_median": statistics.median(rates) if rates else None,
            "decode_tok_s": rates, "tokens": [a["tokens"] for a in answers],
            "acceptance": sum(a["accepted"] or 0 for a in answers) / drafted if drafted else None,
            "drafted": drafted, "texts": [a["text"] for a in answers]}


def rounds_for(workload: str, clients: int, rounds: int, repeats: int, quick: bool = False) -> int:
    """Rounds of a level on each server: at one client every task (`--quick`: the first three) `repeats` times (the
    ratio is then paired by task), otherwise `rounds` × `repeats`."""
    tasks = len(prompts(workload))
    return repeats * ((min(tasks, 3) if quick else tasks) if clients == 1 else rounds)


def run_speculative(servers: dict[str, tuple[str, int]], plan: Plan, checkpoint: Callable[[dict[str, Any]], None],
                    workloads: tuple[str, ...] = tuple(LEVELS), repeats: int = 1) -> dict[str, Any]:
    """Every level of `workloads`, round by round: each round (one request a client) runs on the servers one right
    after the other (ours off and ngram in turn first), so the two runs of a round's pair are neighbours in time, in
    the same spell of the machine, on the same tasks; `servers`: name → (url, pid)."""
    runs: dict[str, Any] = {name: {} for name in servers}
    rounds = 1 if plan.quick else 2
    for url, _ in servers.values():  # warm-up
        one_request(url, prompts("code")[0][0], 8)
    for workload, levels in (QUICK_LEVELS if plan.quick else LEVELS).items():
        if workload not in workloads:
            continue
        for clients in levels:
            total = rounds_for(workload, clients, rounds, repeats, plan.quick)
            for round_index in range(total):
                for name in paired_order(list(servers), round_index, total // repeats):
                    url, pid = servers[name]
                    label = f"{name}: {workload}, {clients} client(s), round {round_index + 1}/{total}"
                    logger.info("%s", label)
                    result = measure_quietly(
                        label, lambda _attempt, u=url, c=clients, r=round_index: run_round(u, workload, c, r),
                        [pid], plan)
                    level = runs[name].setdefault(workload, {}).get(str(clients))
                    runs[name][workload][str(clients)] = merge_rounds((level or {}).get("rounds", []) + [result])
                checkpoint(runs)
    return runs


def paired_order(names: list[str], round_index: int, per_repeat: int) -> list[str]:
    """Ours off and ngram swap places every other round, and every repeat (of `per_repeat` rounds) starts with the
    other one, so that each task's rounds have each of them first in turn whatever the number of tasks; llama-server
    (if any) runs after them."""
    ours = [name for name in names if name in (OFF, NGRAM)]
    flipped = (round_index % per_repeat + round_index // per_repeat) % 2
    return (ours[::-1] if flipped else ours) + [name for name in names if name not in ours]


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A level's rounds on one server: the medians of their rates, every draft, every answer (`rounds` keeps each
    one whole)."""
    drafted = sum(r.get("drafted") or 0 for r in rounds)
    accepted = sum((r.get("acceptance") or 0) * (r.get("drafted") or 0) for r in rounds)
    decode = [rate for r in rounds for rate in r.get("decode_tok_s") or []]
    return {"clients": rounds[0]["clients"], "rounds": rounds, "requests": sum(r["requests"] for r in rounds),
            "decode_tok_s_median": statistics.median(decode) if decode else None,
            "aggregate_tok_s": statistics.median(r["aggregate_tok_s"] for r in rounds),
            "acceptance": accepted / drafted if drafted else None, "drafted": drafted,
            "tokens": [t for r in rounds for t in r["tokens"]], "texts": [t for r in rounds for t in r["texts"]],
            "neighbour_cpu": max(r.get("neighbour_cpu", 0.0) for r in rounds)}


# ---- ratios, targets, Markdown (pure) ----------------------------------------------------------------------


def ratio(runs: dict[str, Any], server: str, workload: str, clients: int, key: str) -> float | None:
    """`server`'s `key` over ours off's: the median of the ratios round by round (paired)."""
    ratios = round_ratios(runs, server, workload, clients, key)
    return statistics.median(ratios) if ratios else None


def round_ratios(runs: dict[str, Any], server: str, workload: str, clients: int, key: str) -> list[float]:
    mine = ((runs.get(server) or {}).get(workload) or {}).get(str(clients))
    base = ((runs.get(OFF) or {}).get(workload) or {}).get(str(clients))
    if not mine or not base:
        return []
    pairs = list(zip(mine.get("rounds") or [mine], base.get("rounds") or [base]))
    return [a[key] / b[key] for a, b in pairs if a.get(key) and b.get(key)]


def key_for(clients: int) -> str:
    """One client: the median request's decode rate; several: completion tokens per wall second of the level."""
    return "decode_tok_s_median" if clients == 1 else "aggregate_tok_s"


def same_texts(runs: dict[str, Any], workload: str, clients: int) -> tuple[int, int] | None:
    """How many greedy answers ngram gave exactly as off did (they may part at a near-tie: batch rounding)."""
    mine = ((runs.get(NGRAM) or {}).get(workload) or {}).get(str(clients))
    base = ((runs.get(OFF) or {}).get(workload) or {}).get(str(clients))
    if not mine or not base:
        return None
    return sum(a == b for a, b in zip(mine["texts"], base["texts"])), len(base["texts"])


def speculative_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    runs = results.get("runs") or {}
    goals = [("code", 1, 1.6), ("code", 4, 1.2), ("prose", 1, 0.97), ("prose", 4, 0.97), ("prose", 8, 0.97),
             ("json", 1, 0.97), ("json", 4, 0.97), ("schema", 1, 0.97), ("schema", 4, 0.97)]
    checks = []
    for workload, clients, bound in goals:
        check = target(f"ours ngram / off, {workload}, {clients} client{'s' if clients > 1 else ''}, "
                       f"{'decode tok/s' if clients == 1 else 'aggregate tok/s'}",
                       ratio(runs, NGRAM, workload, clients, key_for(clients)), ">=", bound,
                       [((runs.get(s) or {}).get(workload) or {}).get(str(clients)) for s in (NGRAM, OFF)])
        checks.append({**check, "round_ratios": round_ratios(runs, NGRAM, workload, clients, key_for(clients))})
    return checks


def share(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def speculative_markdown(results: dict[str, Any]) -> str:
    meta, runs = results["meta"], results.get("runs") or {}
    repeats = meta.get("repeats", 1)
    lines = ["# Speculative decoding (issue 17)", "",
             f"{meta['date']}, {meta['model']}, {meta['threads']} threads, commit {meta['commit']}"
             f"{', quick' if meta.get('quick') else ''}. Greedy, non-streamed; decode tok/s by each server's own "
             "timings (median request), aggregate = completion tokens / wall time of a round (its median over "
             "rounds). A round is one request a client, run on the servers one right after the other (ours off and "
             "ngram in turn first); at one client each task is a round"
             f"{f' ({repeats} times)' if repeats > 1 else ''}. "
             "A ratio is the median of the rounds' ratios (the two runs of a pair one right after the other, on the "
             "same tasks), so it need not be the ratio of the medians beside it.", ""]
    if meta.get("peer_note"):
        lines += [f"> {meta['peer_note']}", ""]
    lines += ["| workload | clients | server | decode tok/s | aggregate tok/s | vs off (decode / aggregate) | "
              "accepted / drafted | same text as off | CPU taken by others |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for workload, levels in LEVELS.items():
        for clients in levels:
            for server in SERVERS:
                run = ((runs.get(server) or {}).get(workload) or {}).get(str(clients))
                if not run:
                    continue
                same = same_texts(runs, workload, clients) if server == NGRAM else None
                lines.append(
                    f"| {workload} | {clients} | {server} | {fmt(run['decode_tok_s_median'])} | "
                    f"{fmt(run['aggregate_tok_s'])} | "
                    f"{fmt(ratio(runs, server, workload, clients, 'decode_tok_s_median'), digits=2)} / "
                    f"{fmt(ratio(runs, server, workload, clients, 'aggregate_tok_s'), digits=2)} | "
                    f"{share(run.get('acceptance'))} | "
                    f"{f'{same[0]}/{same[1]}' if same else ''} | {pct(run.get('neighbour_cpu'))} |")
    lines += ["", "| target | value | bound | met | rounds | ratio by round (least – most) |",
              "|---|---:|---:|---|---:|---|"]
    for check in results.get("targets") or speculative_targets(results):
        verdict = {True: "yes", False: "**no**", None: "–"}[check["pass"]]
        each = check.get("round_ratios") or []
        lines.append(f"| {check['check']} | {fmt(check['ratio'], digits=2)} | {check['target']} | {verdict}"
                     f"{' (disturbed)' if check['disturbed'] else ''} | {len(each)} | "
                     f"{f'{fmt(min(each), digits=2)} – {fmt(max(each), digits=2)}' if each else ''} |")
    return "\n".join(lines) + "\n"

