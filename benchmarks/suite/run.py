"""One benchmark run: the raw loop and the servers side by side, level by level, then the outputs."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from edge_llm.models.fetch import default_model_path

from . import processes
from .load import full_length_body, prepare_target, run_levels, shared_prefix_text, target_results
from .plan import NEW_TOKENS, RAW_BATCHES, REPO, RESULTS, SERVER_PARALLEL, THREADS, Plan
from .plot import plot
from .raw import RawLoop, raw_model, tokenize
from .report import evaluate_targets, markdown_report

logger = logging.getLogger(__name__)


def git_commit() -> str:
    """The commit measured, marked "+dirty" when src/ has uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO, capture_output=True, text=True)
    return (head.stdout.strip() or "unknown") + ("+dirty" if status.stdout.strip() else "")


def metadata(model: Path, plan: Plan) -> dict[str, Any]:
    import llama_cpp

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "model": model.name,
        "threads": THREADS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_version": llama_cpp.__version__,
        "commit": git_commit(),
        "quick": plan.quick,
        "attempts": plan.attempts,
        "server_parallel": SERVER_PARALLEL,
        "new_tokens": NEW_TOKENS,
        "loadavg_before": os.getloadavg()[0],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan.make(args.quick, args.quiet_wait)
    model = (args.model or default_model_path()).resolve()
    RESULTS.mkdir(parents=True, exist_ok=True)
    prefix = shared_prefix_text()
    results: dict[str, Any] = {"meta": metadata(model, plan)}
    if not args.skip_peer:
        processes.ensure_peer_venv()
    logger.info("raw decode loop, our server%s, level by level", "" if args.skip_peer else " and llama_cpp.server")
    with raw_model(model, max(RAW_BATCHES)) as (_, ctx, vocab), ExitStack() as servers:
        raw = RawLoop(ctx, vocab, plan)
        extra_body = full_length_body(raw.end_tokens)
        starts = [("ours", processes.ours)] + ([] if args.skip_peer else [("peer", processes.peer)])
        targets = []
        for name, start in starts:
            server = servers.enter_context(start(model, RESULTS))
            targets.append(prepare_target(name, server.url, server.process.pid, plan, extra_body))
        run_levels(raw, targets, plan)
        for target in targets:
            results[target.name] = target_results(target, plan, prefix)
        results.setdefault("peer", None)
        results["raw"] = raw.results(len(tokenize(vocab, prefix)))
    results["meta"]["loadavg_after"] = os.getloadavg()[0]
    results["targets"] = evaluate_targets(results["raw"], results["ours"], results["peer"])
    return results


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    json_path = out_dir / "latest.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out_dir / "latest.md").write_text(markdown_report(results), encoding="utf-8")
    plot(json_path, out_dir / "latest.png")
    logger.info("wrote %s, latest.md and latest.png", json_path)
