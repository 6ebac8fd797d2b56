"""Structured outputs (issue 14): plain decoding against the grammar-constrained workloads — response_format
json_object, a json_schema with nesting and enums, a required tool call — at 1, 4 and 8 clients, ours and
llama.cpp's llama-server side by side; and what compiling a grammar costs, in process and as the first-request
latency of a never-seen schema against a repeated one. The ratios and the report are in structured_report.py."""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from edge_llm.cli import bench
from edge_llm.cli.progress import ProgressBar

from .measure import measure_quietly
from .plan import Plan
from .report import fmt

logger = logging.getLogger(__name__)

# plain_tools: the tool call's prompt (the tool's schema in it: 406 tokens instead of 71) answered without a grammar,
# its plain rate: a longer prompt alone decodes ~10% slower on this machine.
WORKLOADS = ("plain", "json_object", "json_schema", "plain_tools", "tool_call")
LEVELS = (1, 4, 8)
ANSWER_TOKENS = 200
FIRST_REQUEST_TRIALS = 5
PROMPT = ("Fill in the staff directory of a fictional software company: its name and ten team members, each with "
          "name, age, role, city and country, three skills and whether they are active. Answer in JSON.")

ROLES = ["engineer", "designer", "manager", "analyst", "tester"]
COUNTRIES = ["France", "Germany", "Japan", "Brazil", "Canada", "India"]
TEAM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "company": {"type": "string"},
        "members": {"type": "array", "minItems": 10, "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "role": {"type": "string", "enum": ROLES},
                "location": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "country": {"type": "string", "enum": COUNTRIES}},
                             "required": ["city", "country"]},
                "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                "active": {"type": "boolean"},
            },
            "required": ["name", "age", "role", "location", "skills", "active"],
        }},
    },
    "required": ["company", "members"],
}
TEAM_TOOL = {"type": "function", "function": {
    "name": "save_directory", "description": "Saves a company's staff directory.", "parameters": TEAM_SCHEMA}}


def workload_body(name: str) -> dict[str, Any]:
    """The request fields of a workload, the same for both servers. Plain answers run to ANSWER_TOKENS
    (`ignore_eos`, which both servers accept); constrained ones end where the grammar does or at ANSWER_TOKENS
    (the schema asks for more than that)."""
    if name == "plain":
        return {"ignore_eos": True}
    if name == "plain_tools":
        return {"ignore_eos": True, "tools": [TEAM_TOOL], "tool_choice": "auto"}
    if name == "json_object":
        return {"response_format": {"type": "json_object"}}
    if name == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "directory", "schema": TEAM_SCHEMA}}}
    if name == "tool_call":
        return {"tools": [TEAM_TOOL], "tool_choice": "required"}
    raise ValueError(f"unknown workload {name!r}")


def fresh_schema(tag: str, fields: int = 24) -> dict[str, Any]:
    """A large schema no server has seen (its names carry `tag`): enums, nested objects and arrays."""
    properties: dict[str, Any] = {}
    for i in range(fields):
        kind = i % 3
        properties[f"f{tag}_{i}"] = (
            {"type": "string", "enum": [f"v{tag}_{i}_{j}" for j in range(12)]} if kind == 0 else
            {"type": "object", "properties": {"n": {"type": "integer"}, "tags": {"type": "array",
                                                                           "items": {"type": "string"}}},
             "required": ["n", "tags"]} if kind == 1 else {"type": "string"})
    return {"type": "object", "properties": properties, "required": list(properties)}


@dataclass
class Server:
    """A running server under test: its name in the report, URL, process and the model id it serves."""

    name: str
    url: str
    pid: int
    model: str | None = None


def prepare(server: Server) -> Server:
    config = bench.BenchConfig(base_url=server.url)
    server.model = asyncio.run(bench.discover_model(config))
    for workload in WORKLOADS:  # warm-up: one short request each
        warm = bench.BenchConfig(base_url=server.url, max_tokens=8, model=server.model,
                                 extra_body=workload_body(workload))
        asyncio.run(bench.run_level(warm, 1, 1, [PROMPT], tag=f"warmup-{workload}"))
    return server


def answer_openings(servers: Sequence[Server], tokens: int = 24) -> dict[str, dict[str, str]]:
    """How each server's answer to each workload begins (not streamed): whether a grammar shaped it shows here,
    e.g. a tool call that a server does not constrain for this model's chat template starts as free text."""
    openings: dict[str, dict[str, str]] = {}
    for server in servers:
        openings[server.name] = {}
        for workload in WORKLOADS:
            body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens, "temperature": 0,
                    "model": server.model, **workload_body(workload)}
            try:
                message = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600).json()[
                    "choices"][0]["message"]
                calls = message.get("tool_calls")
                text = f"tool_calls: {json.dumps(calls)}" if calls else message.get("content") or ""
            except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
                text = f"error: {exc}"
            openings[server.name][workload] = text
    return openings


def requests_for(clients: int, plan: Plan) -> int:
    if clients == 1:
        return 2 if plan.quick else 3
    return clients if plan.quick else 2 * clients


def measure_workload(server: Server, workload: str, clients: int, repeat: int, plan: Plan,
                     pids: Sequence[int]) -> dict[str, Any]:
    config = bench.BenchConfig(base_url=server.url, max_tokens=ANSWER_TOKENS, temperature=0.0, model=server.model,
                               extra_body=workload_body(workload))

    def one(attempt: int) -> dict[str, Any]:
        bar = ProgressBar(f"{server.name} {workload} {clients:>2} clients")
        level = bench.run_level(config, clients, requests_for(clients, plan), [PROMPT], bar,
                                tag=f"{workload}-c{clients}r{repeat}t{attempt}")
        return asyncio.run(level).to_dict()

    return measure_quietly(f"{server.name} {workload} {clients} clients", one, pids, plan)


def run_workloads(servers: Sequence[Server], plan: Plan, levels: Sequence[int] = LEVELS,
                  measured: Callable[[dict[str, Any]], None] | None = None,
                  workloads: Sequence[str] = WORKLOADS) -> dict[str, Any]:
    """runs[server][workload][clients] = the repeats' level statistics. For each client count and repeat, every
    workload on every server one right after the other (a paired design: the machine drifts within minutes).
    `measured(runs)` is called after each measurement (the caller writes what there is so far)."""
    pids = [s.pid for s in servers]
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        s.name: {w: {str(c): [] for c in levels} for w in workloads} for s in servers}
    for clients in levels:
        for repeat in range(1 if plan.quick else 2):
            for workload in workloads:
                for server in servers:
                    stats = measure_workload(server, workload, clients, repeat, plan, pids)
                    runs[server.name][workload][str(clients)].append(stats)
                    if measured is not None:
                        measured(runs)
                    logger.info("%s %s %d clients: %.1f tok/s aggregate, %s tok/s server decode", server.name,
                                workload, clients, stats["aggregate_tokens_per_s"],
                                fmt(stats.get("server_decode_tokens_per_s_median")))
    return runs


async def _first_requests(server: Server, trials: int) -> dict[str, Any]:
    """TTFT of a request bringing a never-seen schema, then of the same request again (its grammar cached), with
    one prompt throughout (so the prefix cache serves both alike) and max_tokens 1."""
    fresh, repeated = [], []
    async with bench.new_client(bench.BenchConfig(base_url=server.url), 1) as client:
        for _ in range(trials):
            schema = fresh_schema(uuid.uuid4().hex[:8])
            config = bench.BenchConfig(base_url=server.url, max_tokens=1, model=server.model, extra_body={
                "response_format": {"type": "json_schema", "json_schema": {"name": "fresh", "schema": schema}}})
            for into in (fresh, repeated):
                result = await bench.stream_chat(client, config, "Fill in this form with plausible values.")
                into.append(result.ttft if result.ok else None)
    return first_request_summary(fresh, repeated)


def first_request_summary(fresh: Sequence[float | None], repeated: Sequence[float | None]) -> dict[str, Any]:
    pairs = [(f, r) for f, r in zip(fresh, repeated) if f is not None and r is not None]
    return {
        "trials": len(fresh),
        "fresh_ttft_s": list(fresh),
        "repeated_ttft_s": list(repeated),
        "fresh_median_s": statistics.median(f for f, _ in pairs) if pairs else None,
        "repeated_median_s": statistics.median(r for _, r in pairs) if pairs else None,
        "extra_median_s": statistics.median(f - r for f, r in pairs) if pairs else None,
    }


def first_request_latency(servers: Sequence[Server], plan: Plan) -> dict[str, Any]:
    pids = [s.pid for s in servers]
    trials = 3 if plan.quick else FIRST_REQUEST_TRIALS
    return {s.name: measure_quietly(f"{s.name} fresh schema", lambda _, s=s: asyncio.run(_first_requests(s, trials)),
                                    pids, plan) for s in servers}


def compile_costs(model: Path, repeats: int = 20) -> list[dict[str, Any]]:
    """In process, on the model's vocabulary: the schema → GBNF conversion (Python, tokenizer thread), compiling
    the GBNF (llama_sampler_init_grammar: what the engine thread did per request before the cache) and cloning a
    compiled one (llama_sampler_clone: what it does now), medians of `repeats`."""
    import llama_cpp

    from edge_llm.engine.llama.schema_grammar import json_schema_to_grammar
    from edge_llm.prompting.tools import forced_call_grammar

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    vocab_model = llama_cpp.llama_model_load_from_file(str(model).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(vocab_model)
    cases = {
        "json_object": lambda: json_schema_to_grammar({"type": "object"}),
        "json_schema (team)": lambda: json_schema_to_grammar(TEAM_SCHEMA),
        "tool_call (team)": lambda: forced_call_grammar([TEAM_TOOL["function"]], json_schema_to_grammar),
        "fresh schema (24 fields)": lambda: json_schema_to_grammar(fresh_schema("x")),
        "fresh schema (72 fields)": lambda: json_schema_to_grammar(fresh_schema("x", 72)),
    }
    rows = []
    try:
        for name, convert in cases.items():
            started = time.perf_counter()
            grammar = convert()
            convert_s = time.perf_counter() - started
            compiles, clones = [], []
            for _ in range(repeats):
                started = time.perf_counter()
                handle = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
                compiles.append(time.perf_counter() - started)
                started = time.perf_counter()
                copy = llama_cpp.llama_sampler_clone(handle)
                clones.append(time.perf_counter() - started)
                llama_cpp.llama_sampler_free(copy)
                llama_cpp.llama_sampler_free(handle)
            rows.append({"grammar": name, "chars": len(grammar), "convert_ms": convert_s * 1000,
                         "compile_ms": statistics.median(compiles) * 1000, "clone_ms": statistics.median(clones) * 1000})
    finally:
        llama_cpp.llama_model_free(vocab_model)
    return rows
