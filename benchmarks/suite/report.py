"""The paired ratios, the targets (benchmarks/README.md, "Targets") and the Markdown report, latest.md."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .plan import CLIENT_LEVELS, DISTURBED, NEW_TOKENS


def level(result: dict[str, Any] | None, clients: int) -> dict[str, Any] | None:
    if not result:
        return None
    return next((lv for lv in result["levels"] if lv["concurrency"] == clients), None)


def raw_batch(raw: dict[str, Any], batch: int) -> dict[str, Any] | None:
    return next((b for b in raw["batches"] if b["batch"] == batch), None)


def raw_rate(raw: dict[str, Any], batch: int, key: str = "decode_tokens_per_s") -> float | None:
    found = raw_batch(raw, batch)
    return found[key] if found else None


def raw_end_to_end(raw: dict[str, Any], batch: int) -> float | None:
    return raw_rate(raw, batch, "end_to_end_tokens_per_s")


def paired_ratio(ours_level: dict[str, Any] | None, raw: dict[str, Any], batch: int, raw_key: str,
                 ours_key: str = "aggregate_tokens_per_s") -> float | None:
    """Median over our repeats of (`ours_key` / mean of the raw runs just before and just after it).

    Falls back to the plain ratio of medians when the level was not measured between raw groups.
    """
    found = raw_batch(raw, batch)
    if ours_level is None or found is None:
        return None
    repeats, groups = ours_level.get("repeats") or [], found.get("groups") or []
    if not repeats or len(groups) != len(repeats) + 1:
        return ratio(ours_level[ours_key], found[raw_key])
    ratios = [r[ours_key] / ((groups[i][raw_key] + groups[i + 1][raw_key]) / 2)
              for i, r in enumerate(repeats) if r[ours_key] is not None]
    if not ratios:
        return None
    return statistics.median(ratios)


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return value / reference


def paired_server_ratio(mine: dict[str, Any] | None, theirs: dict[str, Any] | None, key: str) -> float | None:
    """Median over repeats of ours / peer, each pair measured one right after the other."""
    if mine is None or theirs is None:
        return None
    pairs = list(zip(mine.get("repeats") or [mine], theirs.get("repeats") or [theirs]))
    ratios = [r for a, b in pairs if (r := ratio(a.get(key), b.get(key))) is not None]
    return statistics.median(ratios) if ratios else None


def target(name: str, value: float | None, op: str, bound: float,
           inputs: Sequence[dict[str, Any] | None], record_only: bool = False) -> dict[str, Any]:
    """A target check; `record_only` ones are shown without a verdict."""
    passed = None if value is None or record_only else (value >= bound if op == ">=" else value <= bound)
    disturbance = max((i.get("neighbour_cpu", 0.0) for i in inputs if i), default=0.0)
    shown = f"({op} {bound:g}: for the record)" if record_only else f"{op} {bound:g}"
    return {"check": name, "ratio": value, "target": shown, "pass": passed,
            "inputs_neighbour_cpu": disturbance, "disturbed": disturbance > DISTURBED}


def evaluate_targets(raw: dict[str, Any], ours: dict[str, Any], peer: dict[str, Any] | None) -> list[dict[str, Any]]:
    agg, ttft, stream = "aggregate_tokens_per_s", "ttft_median_s", "stream_tokens_per_s_median"
    checks = []
    for clients in CLIENT_LEVELS:
        mine, theirs, ceiling = level(ours, clients), level(peer, clients), raw_batch(raw, clients)
        if clients == 1:
            checks.append(target("ours 1 client stream (decode) tok/s / raw batch 1 decode",
                                 paired_ratio(mine, raw, 1, "decode_tokens_per_s", stream), ">=", 0.95,
                                 [mine, ceiling]))
        checks.append(target(f"ours {clients} client{'s' if clients > 1 else ''} aggregate tok/s / raw batch "
                             f"{clients} end-to-end", paired_ratio(mine, raw, clients, "end_to_end_tokens_per_s"),
                             ">=", 0.95, [mine, ceiling]))
        checks.append(target(f"ours {clients} client{'s' if clients > 1 else ''} aggregate tok/s / raw batch "
                             f"{clients} decode steps only (prefill left out: see benchmarks/README.md)",
                             paired_ratio(mine, raw, clients, "decode_tokens_per_s"), ">=", 0.95, [mine, ceiling],
                             record_only=True))
        if clients > 1:
            checks.append(target(f"ours {clients} clients aggregate tok/s / peer {clients} clients",
                                 paired_server_ratio(mine, theirs, agg), ">=", 2.0, [mine, theirs]))
    mine, theirs = level(ours, 8), level(peer, 8)
    checks.append(target("ours 8 clients median TTFT / peer 8 clients median TTFT",
                         paired_server_ratio(mine, theirs, ttft), "<=", 0.2, [mine, theirs]))
    prefix = ours["shared_prefix"]
    checks.append(target("ours shared prefix: later TTFT (median) / first TTFT",
                         ratio(prefix["later_ttft_median_s"], prefix["first_ttft_s"]), "<=", 0.1, [prefix]))
    return checks


# ---- latest.md ------------------------------------------------------------------------------------------


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def pct(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 100:.0f}%" + (" ⚠" if value > DISTURBED else "")


def markdown_report(results: dict[str, Any]) -> str:
    meta, raw = results["meta"], results["raw"]
    lines = [
        "# Benchmark results",
        "",
        f"{meta['date']} · model `{meta['model']}` · {meta['threads']} threads · {meta['cpus']} CPUs · "
        f"llama-cpp-python {meta['llama_cpp_version']} · commit `{meta['commit']}`"
        f"{' · **quick run**' if meta['quick'] else ''} · load average (1 min) before: {meta['loadavg_before']:.2f}, "
        f"after: {meta['loadavg_after']:.2f}",
        "",
        f"## (a) Raw llama-cpp-python decode ceiling ({raw['prompt_tokens']}-token prompt, "
        f"{raw['new_tokens']} greedy tokens per sequence)",
        "",
        "| batch | decode tok/s (median) | decode tok/s (best) | prefill ms | end-to-end tok/s | other CPU use |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b in raw["batches"]:
        lines.append(f"| {b['batch']} | {fmt(b['decode_tokens_per_s'])} | {fmt(b['decode_tokens_per_s_best'])} | "
                     f"{fmt(b['prefill_s'], 1000, 0)} | {fmt(b['end_to_end_tokens_per_s'])} | {pct(b.get('neighbour_cpu'))} |")
    lines += ["", f"## (b, c) Servers under load ({NEW_TOKENS} max tokens, temperature 0, streamed)", "",
              "| server | clients | requests | errors | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms "
              "| stream tok/s | aggregate tok/s | raw same batch: decode / end-to-end tok/s | other CPU use |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("ours", "peer"):
        for lv in (results.get(name) or {}).get("levels", []):
            lines.append(
                f"| {name} | {lv['concurrency']} | {lv['requests']} | {lv['errors']} | "
                f"{fmt(lv['ttft_median_s'], 1000, 0)} | {fmt(lv['ttft_p95_s'], 1000, 0)} | "
                f"{fmt(lv['itl_median_s'], 1000, 1)} | {fmt(lv['itl_p95_s'], 1000, 1)} | "
                f"{fmt(lv['stream_tokens_per_s_median'])} | {fmt(lv['aggregate_tokens_per_s'])} | "
                f"{fmt(raw_rate(raw, lv['concurrency']))} / {fmt(raw_end_to_end(raw, lv['concurrency']))} | "
                f"{pct(lv.get('neighbour_cpu'))} |")
    lines += ["", f"## (d) Shared prefix (~{raw['shared_prefix_tokens']}-token system prompt, sequential requests)",
              "", "| server | requests | first TTFT ms | later TTFT ms (median) | later / first | all TTFTs ms "
              "| other CPU use |", "|---|---:|---:|---:|---:|---|---:|"]
    for name in ("ours", "peer"):
        prefix = (results.get(name) or {}).get("shared_prefix")
        if prefix:
            all_ttfts = ", ".join(fmt(t, 1000, 0) for t in prefix["ttft_s"])
            lines.append(f"| {name} | {prefix['requests']} | {fmt(prefix['first_ttft_s'], 1000, 0)} | "
                         f"{fmt(prefix['later_ttft_median_s'], 1000, 0)} | "
                         f"{fmt(ratio(prefix['later_ttft_median_s'], prefix['first_ttft_s']), 1, 3)} | "
                         f"{all_ttfts} | {pct(prefix.get('neighbour_cpu'))} |")
    lines += ["", "## Targets", "", "| check | ratio | target | pass | other CPU use (worst input) |",
              "|---|---:|---:|:---:|---:|"]
    for check in results["targets"]:
        mark = {True: "yes", False: "**no**", None: "–"}[check["pass"]]
        lines.append(f"| {check['check']} | {fmt(check['ratio'], 1, 3)} | {check['target']} | {mark} | "
                     f"{pct(check.get('inputs_neighbour_cpu'))} |")
    if any(check.get("disturbed") for check in results["targets"]):
        lines += ["", f"⚠: measured while other processes used more than {DISTURBED:.0%} of the CPUs (after "
                  f"{results['meta'].get('attempts', 3)} tries); such figures and the ratios built on them are not "
                  "to be trusted."]
    lines += ["", "Definitions: see benchmarks/README.md. Raw \"decode\" excludes the prefill, \"end-to-end\" "
              "includes it (the same work as a request: prefill, then 64 tokens). Ratios pair each repeat of our "
              "B-client level with the raw B runs just before and after it (median over repeats). Every request runs to 64 tokens (end-of-generation tokens banned "
              "with logit_bias, as the raw loop ignores them). Aggregate tok/s = completion tokens / wall time of "
              "the level (prefill and queueing included).", ""]
    return "\n".join(lines)
