"""The keystroke-replay part's summaries, targets and Markdown (infill.md): issue 16's latency goals for code
completion in the editor, ours and llama-server side by side.

Pure: results dicts in, dicts and text out."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from edge_llm.cli.bench_stats import percentile

from .plan import DISTURBED
from .report import fmt, pct, ratio, target
from .structured_report import OURS, PEER, _meta_line, _targets_table

NEW_LINE, KEYSTROKE = "new_line", "keystroke"  # a request's kind: the first on a fresh line, one after a word
TTFT_GOAL_S = 0.150  # issue 16: after a one-line edit, cache warm, median
COMPLETION_GOAL_S = 1.0  # issue 16: a whole 32-token completion


def kept_indices(runs: dict[str, Any]) -> tuple[list[int], bool]:
    """The line pairs in which no server's replay was disturbed (other processes above DISTURBED of the CPUs), and
    whether there are any; all pairs when none is undisturbed."""
    records = [server["lines"] for server in runs.values()]
    count = min((len(r) for r in records), default=0)
    kept = [i for i in range(count) if all(r[i]["neighbour_cpu"] <= DISTURBED for r in records)]
    return (kept, True) if kept else (list(range(count)), False)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _finals(requests: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [r["final"][key] for r in requests if r["final"] and isinstance(r["final"].get(key), (int, float))]


def completion_estimate(request: dict[str, Any], n_predict: int) -> float | None:
    """A whole `n_predict`-token completion's time from this one's: its TTFT and n_predict − 1 tokens at its decode
    speed (the server's predicted_per_token_ms), for answers the editor rules or the model ended sooner."""
    per_token = (request["final"] or {}).get("predicted_per_token_ms")
    if request["ttft_s"] is None or not isinstance(per_token, (int, float)) or per_token <= 0:
        return None
    return request["ttft_s"] + (n_predict - 1) * per_token / 1000


def server_summary(records: Sequence[dict[str, Any]], n_predict: int) -> dict[str, Any]:
    """One server's line records → the latencies (TTFT by kind, completions), token counts and cancellations."""
    requests = [r for record in records for r in record["requests"]]
    completions = [r for r in requests if r["runs_to_end"] and r["final"] is not None]
    summary: dict[str, Any] = {
        "lines": len(records), "requests": len(requests),
        "cancelled": sum(r["cancelled"] for r in requests),
        "completed": sum(r["final"] is not None for r in requests),
        "errors": sum(r["error"] is not None for r in requests),
        "never_shown": sum(r["ttft_s"] is None and r["error"] is None for r in requests),
        "empty": sum(r["final"] is not None and not r["content"] for r in requests),
        "neighbour_cpu_max": max((record["neighbour_cpu"] for record in records), default=None),
    }
    for kind in (KEYSTROKE, NEW_LINE):
        ttfts = [r["ttft_s"] for r in requests if r["kind"] == kind and r["ttft_s"] is not None]
        summary.update({f"{kind}_n": len(ttfts), f"{kind}_ttft_p50_s": percentile(ttfts, 50),
                        f"{kind}_ttft_p95_s": percentile(ttfts, 95)})
    ends = [r["end_s"] for r in completions if r["end_s"] is not None]
    estimates = [e for r in completions if (e := completion_estimate(r, n_predict)) is not None]
    summary.update({
        "completions": len(completions), "completion_end_p50_s": percentile(ends, 50),
        "completion_end_p95_s": percentile(ends, 95),
        "completion_tokens_median": _median(_finals(completions, "tokens_predicted")),
        "completion_estimate_p50_s": percentile(estimates, 50), "completion_estimate_p95_s": percentile(estimates, 95),
        "prompt_tokens_median": _median([r["prompt_tokens"] for r in requests if r["prompt_tokens"] is not None]),
        "cached_tokens_median": _median(_finals(requests, "cache_n")),
        "computed_tokens_median": _median(_finals(requests, "prompt_n")),
        "prefill_ms_median": _median(_finals(requests, "prompt_ms")),
    })
    for key in ("processed", "cached"):
        values = [record["server_prompt_tokens"][key] for record in records]
        summary[f"server_{key}_total"] = None if any(v is None for v in values) else sum(values)
    return summary


def _line_ttft(record: dict[str, Any]) -> float | None:
    return _median([r["ttft_s"] for r in record["requests"] if r["ttft_s"] is not None])


def paired_ttft_ratio(runs: dict[str, Any], kept: Sequence[int]) -> float | None:
    """Median over the kept lines of ours / llama-server's median TTFT on that line (replayed one right after
    the other)."""
    if OURS not in runs or PEER not in runs:
        return None
    ratios = [r for i in kept
              if (r := ratio(_line_ttft(runs[OURS]["lines"][i]), _line_ttft(runs[PEER]["lines"][i]))) is not None]
    return _median(ratios)


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    runs = results.get("runs") or {}
    kept, undisturbed = kept_indices(runs)
    n_predict = results["meta"]["workload"]["n_predict"]
    servers = {name: server_summary([run["lines"][i] for i in kept], n_predict) for name, run in runs.items()}
    return {"kept_lines": len(kept), "all_lines": min((len(r["lines"]) for r in runs.values()), default=0),
            "undisturbed": undisturbed, "servers": servers,
            "first_requests": {name: [record["requests"][0] for record in run["warmup"]]
                               for name, run in runs.items()},
            "ours_vs_peer_ttft": paired_ttft_ratio(runs, kept)}


def keystroke_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 16's goals for ours; llama-server's figures against them for the record."""
    checks = []
    for name, server in summary["servers"].items():
        inputs = [{"neighbour_cpu": server["neighbour_cpu_max"] or 0.0}]
        record_only = name != OURS
        checks += [
            target(f"{name}: TTFT after a keystroke in a line, p50 (s)", server[f"{KEYSTROKE}_ttft_p50_s"], "<=",
                   TTFT_GOAL_S, inputs, record_only),
            target(f"{name}: TTFT of the first request on a new line, p50 (s)", server[f"{NEW_LINE}_ttft_p50_s"],
                   "<=", TTFT_GOAL_S, inputs, record_only),
            target(f"{name}: a whole 32-token completion, p50 (s, estimate)", server["completion_estimate_p50_s"],
                   "<=", COMPLETION_GOAL_S, inputs, record_only),
        ]
    return checks


def _first_cell(requests: Sequence[dict[str, Any]]) -> str:
    cells = []
    for request in requests:
        final = request["final"] or {}
        cells.append(f"{fmt(request['ttft_s'], 1000, 0)} ({request['prompt_tokens'] or '–'} / "
                     f"{final.get('cache_n', '–')})")
    return ", ".join(cells) or "–"


def infill_markdown(results: dict[str, Any]) -> str:
    meta, summary = results["meta"], summarize(results)
    work = meta["workload"]
    lines = ["# Code completion: keystroke replay on /infill (issue 16)", "", _meta_line(meta), ""]
    if meta.get("peer_note"):
        lines += [f"**{meta['peer_note']}**", ""]
    spans = ", ".join(f"{s['lines'][0]}–{s['lines'][-1]} (warm-up: line {s['warmup']})" for s in work["stretches"])
    lines += [
        f"`{work['source']}` as of {work['source_commit']}, lines {spans} typed again: the first request on each "
        f"fresh line, then one a word (at most {work['max_keystrokes_per_line']}), each sent "
        f"{work['typing_gap_s'] * 1000:.0f} ms after the previous suggestion started to show, cancelling it; the "
        f"line's last runs to its end. n_predict {work['n_predict']}, t_max_predict_ms {work['t_max_predict_ms']}, "
        "n_indent the line's indentation, temperature 0, streamed, cache_prompt. llama-server: "
        f"`--parallel {work['peer_parallel']} {' '.join(work['peer_flags'])}`.", "",
        (f"{summary['kept_lines']} of {summary['all_lines']} line pairs counted (in the others, other processes "
         f"used more than {DISTURBED:.0%} of the CPUs during a replay)." if summary["undisturbed"] else
         f"**Every line pair was disturbed** (other processes above {DISTURBED:.0%} of the CPUs): all "
         f"{summary['all_lines']} are counted."), "",
        "## Latency", "",
        "| server | requests | cancelled | keystroke TTFT p50 ms | p95 | new line TTFT p50 ms | p95 | completion end "
        "p50 ms | p95 | tokens (median) | 32-token estimate p50 ms | p95 | errors / never shown "
        "| other CPU use (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary["servers"].items():
        lines.append(
            f"| {name} | {s['requests']} | {s['cancelled']} | {fmt(s[f'{KEYSTROKE}_ttft_p50_s'], 1000, 0)} | "
            f"{fmt(s[f'{KEYSTROKE}_ttft_p95_s'], 1000, 0)} | {fmt(s[f'{NEW_LINE}_ttft_p50_s'], 1000, 0)} | "
            f"{fmt(s[f'{NEW_LINE}_ttft_p95_s'], 1000, 0)} | {fmt(s['completion_end_p50_s'], 1000, 0)} | "
            f"{fmt(s['completion_end_p95_s'], 1000, 0)} | {fmt(s['completion_tokens_median'], 1, 0)} | "
            f"{fmt(s['completion_estimate_p50_s'], 1000, 0)} | {fmt(s['completion_estimate_p95_s'], 1000, 0)} | "
            f"{s['errors']} / {s['never_shown']} | {pct(s['neighbour_cpu_max'])} |")
    lines += ["", "## Prompt tokens and the cache", "",
              "| server | prompt tokens (median) | cached (median) | computed (median) | prefill ms (median) "
              "| computed, all requests (/metrics) | cached, all requests (/metrics) "
              "| first request of each stretch: TTFT ms (prompt / cached tokens) |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, s in summary["servers"].items():
        lines.append(
            f"| {name} | {fmt(s['prompt_tokens_median'], 1, 0)} | {fmt(s['cached_tokens_median'], 1, 0)} | "
            f"{fmt(s['computed_tokens_median'], 1, 0)} | {fmt(s['prefill_ms_median'], 1, 0)} | "
            f"{fmt(s['server_processed_total'], 1, 0)} | {fmt(s['server_cached_total'], 1, 0)} | "
            f"{_first_cell(summary['first_requests'].get(name, []))} |")
    if summary["ours_vs_peer_ttft"] is not None:
        lines += ["", f"ours / llama-server TTFT, paired by line (median over lines): "
                      f"{fmt(summary['ours_vs_peer_ttft'], 1, 3)}."]
    lines += ["", "## Targets (issue 16)", "", *_targets_table(keystroke_targets(summary)), "",
              "TTFT: request sent → first event with content (an answer with none: its end). Keystroke: a request "
              "after a word; new line: the first request on a fresh line (the cursor after the indentation). "
              "Completion end: the line's last request, sent → its final event (n_indent, t_max_predict_ms, the "
              "model's end or n_predict ends it). 32-token estimate: its TTFT + 31 × the server's "
              "predicted_per_token_ms. Cached and computed tokens: timings.cache_n and prompt_n of the requests that "
              "ended (a cancelled one has no final event); the /metrics columns count every request's. See "
              "benchmarks/README.md.", ""]
    return "\n".join(lines)
