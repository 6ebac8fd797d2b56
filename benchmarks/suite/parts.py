"""The parts that run alone (`run_benchmarks.py --only PART`): structured outputs (issue 14), the real-client
workload (issue 12) and the editor's keystroke replay on /infill (issue 16), ours and llama.cpp's llama-server side
by side when its binary is found (and not --skip-peer); the KV cache types and the persistent prefix cache across a
restart (issue 21) and deterministic mode (issue 18), ours alone. Each writes its own results/PART.{json,md} and leaves
latest.* to the full run."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

import edge_llm
from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.models.fetch import default_model_path, models_dir

from . import processes
from .cold import cold_markdown, run_cold
from .determinism import DEFAULT as DET_DEFAULT
from .determinism import DETERMINISTIC, SERVER_FLAGS, determinism_markdown, determinism_targets, run_determinism
from .keystrokes import PEER_FLAGS as KEYSTROKE_PEER_FLAGS
from .keystrokes import PEER_PARALLEL, run_keystrokes, workload
from .keystrokes_report import infill_markdown, keystroke_targets, summarize
from .kv_types import kv_types_markdown, run_kv_types
from .load import shared_prefix_text
from .measure import wait_for_quiet
from .plan import REPO, RESULTS, THREADS, Plan
from .prefix_restart import prefix_restart_markdown, run_prefix_restart
from .real_client import (BUDGET_S, CLIENTS, PREFIX_RULES, QUESTIONS, QUICK_BUDGET_S, ROOMY_PEER, ROOMY_PEER_CTX, SEED,
                          TEMPERATURE, run_real_client)
from .run import git_commit
from .speculative import PEER_FLAGS as SPECULATIVE_PEER_FLAGS
from .speculative import NGRAM, OFF, run_speculative, speculative_markdown, speculative_targets
from .speculative import LEVELS as SPECULATIVE_LEVELS
from .speculative import PEER as SPECULATIVE_PEER
from .step_cost import run_step_cost, step_cost_markdown
from .structured import (
    ANSWER_TOKENS,
    LEVELS,
    WORKLOADS,
    Server,
    answer_openings,
    compile_costs,
    first_request_latency,
    prepare,
    run_workloads,
)
from .structured_report import OURS, PEER, real_client_markdown, structured_markdown, structured_targets

logger = logging.getLogger(__name__)

PARTS = ("structured", "real-client", "infill", "speculative", "step-cost", "determinism", "kv-types", "prefix-restart",
         "cold")


def measured_commit() -> str:
    """The commit, or, when edge_llm is imported from elsewhere (PYTHONPATH=an export of a commit, to measure it
    while the working tree changes), HEAD and that place."""
    package = Path(edge_llm.__file__).resolve().parents[1]
    if package == REPO / "src":
        return git_commit()
    return f"{git_commit().removesuffix('+dirty')}, package from {package}"


def metadata(model: Path, plan: Plan, binary: Path | None) -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "model": model.name,
        "threads": THREADS,
        "cpus": os.cpu_count(),
        "commit": measured_commit(),
        "quick": plan.quick,
        "peer": f"llama-server ({binary})" if binary else None,
        "peer_note": None if binary else (
            "llama-server not run (--skip-peer) or not found (--llama-server PATH, $LLAMA_SERVER or PATH; "
            "benchmarks/README.md says how to build it): ours only"),
        "loadavg_before": os.getloadavg()[0],
    }


@contextmanager
def servers(model: Path, binary: Path | None, parallel: int, peer_flags: Sequence[str] = ()) -> Iterator[list[Server]]:
    """Ours (`--parallel 8`) and, when there is a binary, llama-server with `parallel` slots (and `peer_flags`),
    both running."""
    with ExitStack() as stack:
        running = stack.enter_context(processes.ours(model, RESULTS))
        found = [Server(OURS, running.url, running.process.pid)]
        if binary is not None:
            running = stack.enter_context(processes.llama_server(binary, model, RESULTS, parallel,
                                                                 extra_flags=peer_flags))
            found.append(Server(PEER, running.url, running.process.pid))
        yield found


def run_structured(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    levels = tuple(args.clients or (LEVELS[:2] if plan.quick else LEVELS))
    workloads = tuple(args.workloads or WORKLOADS)
    if unknown := set(workloads) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    results: dict[str, Any] = {"meta": {**metadata(model, plan, binary), "answer_tokens": ANSWER_TOKENS,
                                        "levels": list(levels), "peer_parallel": max(levels),
                                        "workloads": list(workloads)}}

    def checkpoint(runs: dict[str, Any]) -> None:  # a run cut short still leaves what it measured
        results["runs"] = runs
        results["targets"] = structured_targets(results)
        write_part(args.out, "structured", results)

    wait_for_quiet("grammar compile costs", plan.quiet_wait_s)
    results["compile"] = compile_costs(model)
    with servers(model, binary, max(levels)) as running:
        for server in running:
            prepare(server)
        results["openings"] = answer_openings(running)
        results["first_request"] = first_request_latency(running, plan)
        checkpoint({})
        results["runs"] = run_workloads(running, plan, levels, checkpoint, workloads)
    results["targets"] = structured_targets(results)
    return results


def prefix_tokens(url: str, text: str) -> int | None:
    try:
        response = httpx.post(url + "/tokenize", json={"content": text}, timeout=30)
        return int(response.json()["count"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def run_real_client_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    results: dict[str, Any] = {"meta": {**metadata(model, plan, binary), "clients": CLIENTS, "peer_parallel": CLIENTS,
                                        "requests": CLIENTS if plan.quick else len(QUESTIONS),
                                        "temperature": TEMPERATURE, "seed": SEED,
                                        "budget_s": QUICK_BUDGET_S if plan.quick else BUDGET_S}}
    with servers(model, binary, CLIENTS) as running:
        results["meta"]["prefix_tokens"] = prefix_tokens(running[0].url, shared_prefix_text(PREFIX_RULES))
        results.update(run_real_client(running, plan))
    if binary is not None:  # its slots share no prefix cells: the same load with four times the cells
        with processes.llama_server(binary, model, RESULTS, CLIENTS, ctx=ROOMY_PEER_CTX,
                                    log_name="llama-server-roomy.log") as running:
            results.update(run_real_client([Server(ROOMY_PEER, running.url, running.process.pid)], plan))
        results["meta"]["roomy_peer_ctx"] = ROOMY_PEER_CTX
    return results


def run_infill_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    """The keystroke replay (suite/keystrokes.py); llama-server with its default 4 slots and `--cache-reuse 256`,
    as llama.vscode recommends. The results are rewritten after every line pair."""
    results: dict[str, Any] = {"meta": {**metadata(model, plan, binary), "workload": workload(plan),
                                        "peer_parallel": PEER_PARALLEL}}

    def checkpoint(runs: dict[str, Any]) -> None:
        results["runs"] = runs
        results["summary"] = summarize(results)
        results["targets"] = keystroke_targets(results["summary"])
        write_part(args.out, "infill", results)

    with servers(model, binary, PEER_PARALLEL, KEYSTROKE_PEER_FLAGS) as running:
        checkpoint(run_keystrokes(running, plan, checkpoint))
    return results


def run_speculative_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    """Ours with --speculative off and ngram, and llama-server --spec-type ngram-simple (8 slots), all running; the
    levels go through them one after the other (suite/speculative.py)."""
    workloads = tuple(args.workloads or SPECULATIVE_LEVELS)
    if unknown := set(workloads) - set(SPECULATIVE_LEVELS):
        raise SystemExit(f"unknown workloads {sorted(unknown)}; known: {', '.join(SPECULATIVE_LEVELS)}")
    results: dict[str, Any] = {"meta": {**metadata(model, plan, binary), "peer_parallel": 8,
                                        "peer_flags": list(SPECULATIVE_PEER_FLAGS), "workloads": list(workloads),
                                        "repeats": args.repeats}}

    def checkpoint(runs: dict[str, Any]) -> None:
        results["runs"] = runs
        results["targets"] = speculative_targets(results)
        write_part(args.out, "speculative", results)

    with ExitStack() as stack:
        found: dict[str, tuple[str, int]] = {}
        for name, mode in ((OFF, "off"), (NGRAM, "ngram")):
            running = stack.enter_context(processes.ours(model, RESULTS, "--speculative", mode,
                                                         log_name=f"ours-speculative-{mode}.log"))
            found[name] = (running.url, running.process.pid)
        if binary is not None:
            running = stack.enter_context(
                processes.llama_server(binary, model, RESULTS, 8, extra_flags=SPECULATIVE_PEER_FLAGS))
            found[SPECULATIVE_PEER] = (running.url, running.process.pid)
        checkpoint(run_speculative(found, plan, checkpoint, workloads, args.repeats))
    return results


def run_step_cost_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    wait_for_quiet("step cost", plan.quiet_wait_s)
    return {"meta": {**metadata(model, plan, None), "peer_note": "ours only"}, **run_step_cost(model, plan.quick)}


def run_determinism_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    """Ours by default and ours --deterministic, both running; the levels go through them one after the other
    (suite/determinism.py). llama.cpp has no deterministic mode to compare with."""
    results: dict[str, Any] = {"meta": {**metadata(model, plan, None), "peer_note": "ours only (llama-server has "
                                        "no deterministic mode)", "server_flags": list(SERVER_FLAGS)}}

    def checkpoint(runs: dict[str, Any]) -> None:
        results["runs"] = runs
        results["targets"] = determinism_targets(results)
        write_part(args.out, "determinism", results)

    with ExitStack() as stack:
        found: dict[str, tuple[str, int]] = {}
        for name, flags in ((DET_DEFAULT, ()), (DETERMINISTIC, ("--deterministic",))):
            running = stack.enter_context(processes.ours(model, RESULTS, *SERVER_FLAGS, *flags,
                                                         log_name=f"ours-{name.split()[-1].lstrip('-')}.log"))
            found[name] = (running.url, running.process.pid)
        checkpoint(run_determinism(found, plan, checkpoint))
    return results


def run_kv_types_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    wait_for_quiet("KV cache types", plan.quiet_wait_s)
    results: dict[str, Any] = {"meta": {**metadata(model, plan, None), "peer_note": "ours only"}}

    def checkpoint(measured: dict[str, Any]) -> None:  # a run cut short still leaves what it measured
        results.update(measured)
        write_part(args.out, "kv-types", results)

    results.update(run_kv_types(model, plan, checkpoint))
    return results


def run_prefix_restart_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    wait_for_quiet("prefix cache across a restart", plan.quiet_wait_s)
    return {"meta": {**metadata(model, plan, None), "peer_note": "ours only"}, **run_prefix_restart(model, plan)}


def run_cold_part(args: argparse.Namespace, plan: Plan, model: Path, binary: Path | None) -> dict[str, Any]:
    wait_for_quiet("cold paths", plan.quiet_wait_s)
    other = models_dir() / GEMMA_3_270M.filename
    return {"meta": metadata(model, plan, binary),
            **run_cold(model, plan, binary, other if other.is_file() and other != model else None)}


RUNNERS: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[dict[str, Any]], str]]] = {
    "structured": (run_structured, structured_markdown),
    "real-client": (run_real_client_part, real_client_markdown),
    "infill": (run_infill_part, infill_markdown),
    "speculative": (run_speculative_part, speculative_markdown),
    "step-cost": (run_step_cost_part, step_cost_markdown),
    "determinism": (run_determinism_part, determinism_markdown),
    "kv-types": (run_kv_types_part, kv_types_markdown),
    "prefix-restart": (run_prefix_restart_part, prefix_restart_markdown),
    "cold": (run_cold_part, cold_markdown),
}


def write_part(out: Path, part: str, results: dict[str, Any]) -> str:
    """results/PART.json and .md (PART with "_" for "-"); returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    stem = part.replace("-", "_")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    markdown = RUNNERS[part][1](results)
    (out / f"{stem}.md").write_text(markdown, encoding="utf-8")
    return markdown


def run_part(part: str, args: argparse.Namespace) -> str:
    """Runs one part and writes results/PART.json and .md (PART with "_" for "-"); returns the Markdown."""
    plan = Plan.make(args.quick, args.quiet_wait)
    if args.attempts:
        plan = replace(plan, attempts=args.attempts)
    model = (args.model or default_model_path()).resolve()
    binary = None if args.skip_peer else processes.find_llama_server(args.llama_server)
    if binary is None:
        logger.warning("llama-server skipped or not found: measuring ours only (see benchmarks/README.md)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = RUNNERS[part][0](args, plan, model, binary)
    results["meta"]["loadavg_after"] = os.getloadavg()[0]
    markdown = write_part(args.out, part, results)
    logger.info("wrote %s.json and .md in %s", part.replace("-", "_"), args.out)
    return markdown
