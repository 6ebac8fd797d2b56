"""The structured-output and real-client parts' ratios, targets and Markdown (structured.md, real_client.md).

Pure: results dicts in, dicts and text out (tests/unit/test_structured_report.py)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .plan import DISTURBED
from .report import fmt, pct, ratio, target

OURS, PEER = "ours", "llama-server"
GRAMMAR_WORKLOADS = ("json_object", "json_schema", "tool_call")
# The plain workload each grammar workload is compared with: the same prompt without a grammar.
PLAIN_OF = {"json_object": "plain", "json_schema": "plain", "tool_call": "plain_tools", "plain_tools": "plain"}
DECODE = "server_decode_tokens_per_s_median"
AGGREGATE = "aggregate_tokens_per_s"


def decode_rate(stats: dict[str, Any]) -> float | None:
    """Per-stream decode tok/s by the server's own timing, else by the client's stream timing."""
    value = stats.get(DECODE)
    return value if value is not None else stats.get("stream_tokens_per_s_median")


def _value(stats: dict[str, Any], key: str) -> float | None:
    return decode_rate(stats) if key == DECODE else stats.get(key)


def paired(mine: Sequence[dict[str, Any]] | None, reference: Sequence[dict[str, Any]] | None,
           key: str) -> float | None:
    """Median over repeats of mine / reference, each pair measured one right after the other."""
    if not mine or not reference:
        return None
    ratios = [r for a, b in zip(mine, reference) if (r := ratio(_value(a, key), _value(b, key))) is not None]
    return statistics.median(ratios) if ratios else None


def middle(repeats: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The repeat of median aggregate throughput (the one a table shows)."""
    if not repeats:
        return None
    return sorted(repeats, key=lambda r: r[AGGREGATE])[len(repeats) // 2]


def _repeats(results: dict[str, Any], server: str, workload: str, clients: str) -> list[dict[str, Any]]:
    return ((results["runs"].get(server) or {}).get(workload) or {}).get(clients) or []


def structured_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per client count and workload: ours and the peer's middle repeat and the paired ratios."""
    rows = []
    levels = sorted({c for workloads in results["runs"].values() for by in workloads.values() for c in by}, key=int)
    workloads = next(iter(results["runs"].values()), {}).keys()  # a checkpoint before any run has none
    for clients in levels:
        for workload in workloads:
            mine, theirs = (_repeats(results, s, workload, clients) for s in (OURS, PEER))
            plain = PLAIN_OF.get(workload, "plain")
            if not _repeats(results, OURS, plain, clients):
                plain = "plain"  # (a run from before plain_tools)
            my_plain, their_plain = (_repeats(results, s, plain, clients) for s in (OURS, PEER))
            rows.append({
                "clients": int(clients), "workload": workload, "ours": middle(mine), "peer": middle(theirs),
                "plain": plain,
                "ours_vs_plain_decode": paired(mine, my_plain, DECODE),
                "ours_vs_plain_aggregate": paired(mine, my_plain, AGGREGATE),
                "peer_vs_plain_decode": paired(theirs, their_plain, DECODE),
                "ours_vs_peer_decode": paired(mine, theirs, DECODE),
                "ours_vs_peer_aggregate": paired(mine, theirs, AGGREGATE),
            })
    return rows


def structured_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets: grammar decode ≥ 0.95 × plain and ≥ 0.95 × llama-server's at 1 client; json_schema
    aggregate within 10% of plain at 4 and 8 clients."""
    checks = []
    for row in structured_rows(results):
        workload, clients, inputs = row["workload"], row["clients"], [row["ours"], row["peer"]]
        if workload not in GRAMMAR_WORKLOADS:
            continue
        if clients == 1:
            checks.append(target(f"ours 1 client {workload} decode tok/s / ours {row['plain']}",
                                 row["ours_vs_plain_decode"], ">=", 0.95, inputs))
            checks.append(target(f"ours 1 client {workload} decode tok/s / llama-server {workload}",
                                 row["ours_vs_peer_decode"], ">=", 0.95, inputs))
        elif workload == "json_schema":
            checks.append(target(f"ours {clients} clients json_schema aggregate tok/s / ours plain",
                                 row["ours_vs_plain_aggregate"], ">=", 0.90, inputs))
    return checks


def _tokens_per_request(stats: dict[str, Any] | None) -> float | None:
    if not stats or stats["requests"] == stats["errors"]:
        return None
    return stats["completion_tokens"] / (stats["requests"] - stats["errors"])


def _targets_table(checks: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| check | ratio | target | pass | other CPU use (worst input) |", "|---|---:|---:|:---:|---:|"]
    for check in checks:
        mark = {True: "yes", False: "**no**", None: "–"}[check["pass"]]
        lines.append(f"| {check['check']} | {fmt(check['ratio'], 1, 3)} | {check['target']} | {mark} | "
                     f"{pct(check.get('inputs_neighbour_cpu'))} |")
    return lines


def _cell(text: str, limit: int = 90) -> str:
    """Text in a table cell: one line, pipes escaped, cut at `limit` characters."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("|", "\\|").replace("`", "'")
    return f"`{text[:limit]}`"


def _meta_line(meta: dict[str, Any]) -> str:
    return (f"{meta['date']} · model `{meta['model']}` · {meta['threads']} threads · {meta['cpus']} CPUs · "
            f"commit `{meta['commit']}`{' · **quick run**' if meta.get('quick') else ''} · peer: "
            f"{meta.get('peer') or 'none'}")


def structured_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = ["# Structured outputs: plain vs grammar-constrained decoding", "", _meta_line(meta), ""]
    if meta.get("peer_note"):
        lines += [f"**{meta['peer_note']}**", ""]
    lines += [f"## Decode speed ({meta['answer_tokens']} max tokens, temperature 0, streamed)", "",
              "| clients | workload | tokens/request | ours decode tok/s | ours aggregate tok/s | ours / plain (decode) "
              "| ours / plain (aggregate) | llama-server decode tok/s | llama-server aggregate tok/s "
              "| llama-server / its plain (decode) | ours / llama-server (decode) | ours / llama-server (aggregate) "
              "| other CPU use |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in structured_rows(results):
        mine, theirs = row["ours"] or {}, row["peer"] or {}
        disturbance = max((s.get("neighbour_cpu", 0.0) for s in (mine, theirs) if s), default=None)
        lines.append(
            f"| {row['clients']} | {row['workload']} | {fmt(_tokens_per_request(mine), 1, 0)} | "
            f"{fmt(decode_rate(mine) if mine else None)} | {fmt(mine.get(AGGREGATE))} | "
            f"{fmt(row['ours_vs_plain_decode'], 1, 3)} | {fmt(row['ours_vs_plain_aggregate'], 1, 3)} | "
            f"{fmt(decode_rate(theirs) if theirs else None)} | {fmt(theirs.get(AGGREGATE))} | "
            f"{fmt(row['peer_vs_plain_decode'], 1, 3)} | {fmt(row['ours_vs_peer_decode'], 1, 3)} | "
            f"{fmt(row['ours_vs_peer_aggregate'], 1, 3)} | {pct(disturbance)} |")
    lines += ["", "## Compiling a grammar (in process, medians)", "",
              "| grammar | GBNF chars | schema → GBNF ms (Python, tokenizer thread) | compile ms "
              "(llama_sampler_init_grammar) | clone ms (llama_sampler_clone, the engine thread) |",
              "|---|---:|---:|---:|---:|"]
    for row in results.get("compile") or []:
        lines.append(f"| {row['grammar']} | {row['chars']} | {fmt(row['convert_ms'], 1, 2)} | "
                     f"{fmt(row['compile_ms'], 1, 3)} | {fmt(row['clone_ms'], 1, 3)} |")
    lines += ["", "## First request with a never-seen schema (max_tokens 1, the same prompt throughout)", "",
              "| server | trials | TTFT fresh schema ms (median) | TTFT same schema again ms (median) "
              "| extra ms (median of pairs) | other CPU use |", "|---|---:|---:|---:|---:|---:|"]
    for server, first in (results.get("first_request") or {}).items():
        lines.append(f"| {server} | {first['trials']} | {fmt(first['fresh_median_s'], 1000, 1)} | "
                     f"{fmt(first['repeated_median_s'], 1000, 1)} | {fmt(first['extra_median_s'], 1000, 1)} | "
                     f"{pct(first.get('neighbour_cpu'))} |")
    openings = results.get("openings") or {}
    if openings:
        lines += ["", "## How the answers begin (24 tokens, not streamed)", "", "| workload | "
                  + " | ".join(openings) + " |", "|---|" + "---|" * len(openings)]
        for workload in next(iter(openings.values())):
            cells = [_cell(openings[server].get(workload, "")) for server in openings]
            lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets (issue 14)", "", *_targets_table(results["targets"])]
    if any(check.get("disturbed") for check in results["targets"]):
        lines += ["", f"⚠: measured while other processes used more than {DISTURBED:.0%} of the CPUs."]
    lines += ["", "Ours / plain and llama-server / its plain compare with the same prompt answered without a grammar: "
              "`plain` for json_object and json_schema, `plain_tools` (the tool's schema in the prompt, tool_choice "
              "auto, no grammar) for tool_call; plain_tools / plain is what the longer prompt alone costs.", "",
              "Decode tok/s: (completion tokens − 1) / the decode time the server reports in its last chunk "
              "(ours `timings.decode_ms`, llama-server `timings.predicted_ms`), median over a level's streams. "
              "Aggregate tok/s: all completion tokens / the level's wall time (prefill and queueing included). "
              "Ratios pair measurements taken one right after the other (median over repeats). See "
              "benchmarks/README.md.", ""]
    return "\n".join(lines)


def real_client_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = ["# Real-client workload: no max_tokens, a shared system prompt, 8 clients", "", _meta_line(meta), ""]
    if meta.get("peer_note"):
        lines += [f"**{meta['peer_note']}**", ""]
    lines += [f"{meta['requests']} distinct questions after a {meta['prefix_tokens']}-token system prompt, "
              f"{meta['clients']} clients (closed loop), temperature {meta.get('temperature', 0)}"
              f"{' with seed ' + str(meta['seed']) if meta.get('seed') is not None else ''}, no `max_tokens`, "
              f"a time budget of {fmt(meta.get('budget_s'), 1, 0)} s per server (answers still running then are "
              "cut; their tokens so far count).", "",
              "| server | requests | cut at the budget | errors | tokens/answer (mean) | aggregate tok/s | TTFT p50 ms | TTFT p95 ms "
              "| stream tok/s (median) | running at once (max) | running (mean while busy) | other CPU use |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    servers = [name for name in results if name != "meta"]  # ours, then each llama-server configuration run
    for server in servers:
        level = results.get(server)
        if not level:
            continue
        lines.append(
            f"| {server} | {level['requests']} | {level.get('cut_at_budget', 0)} | {level['errors']} | {fmt(_tokens_per_request(level), 1, 0)} | "
            f"{fmt(level[AGGREGATE])} | {fmt(level['ttft_median_s'], 1000, 0)} | {fmt(level['ttft_p95_s'], 1000, 0)} | "
            f"{fmt(level['stream_tokens_per_s_median'])} | {fmt(level['running_max'], 1, 0)} | "
            f"{fmt(level['running_mean_while_busy'])} | {pct(level.get('neighbour_cpu'))} |")
    mine = results.get(OURS)
    for name in (n for n in servers if n != OURS):
        theirs = results.get(name)
        if mine and theirs and theirs["errors"] < theirs["requests"]:
            lines += ["", f"ours / {name}: aggregate tok/s {fmt(ratio(mine[AGGREGATE], theirs[AGGREGATE]), 1, 3)}, "
                      f"TTFT p50 {fmt(ratio(mine['ttft_median_s'], theirs['ttft_median_s']), 1, 3)}."]
        elif theirs:
            lines += ["", f"{name}: {theirs['errors']} of {theirs['requests']} requests failed "
                      f"({'; '.join(theirs.get('error_samples') or [])})."]
    lines += ["", "Running at once: the server's gauge polled every 0.25 s during the run (ours "
              "`edge_llm_running_sequences`, llama-server `llamacpp:requests_processing`). See benchmarks/README.md.",
              ""]
    return "\n".join(lines)
