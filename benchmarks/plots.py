"""The documentation's benchmark plots, drawn from the results in benchmarks/results/ (docs/benchmarks.md shows them):

    .venv/bin/python benchmarks/plots.py [--results DIR] [--out DIR]

- throughput.png: tokens/s and TTFT against clients, from latest.json (the drawing of latest.png, suite/plot.py);
- targets-<part>.png: each target ratio of a part (latest, speculative, structured, determinism, infill) against
  its target, one bar per check, green when met, red when missed, grey when only kept for the record;
- cold.png: the cold-path figures of cold.json, ours / llama-server (medians over the rounds).

Needs matplotlib (pinned in the `docs` extra). Run it after a benchmark run and commit the plots with the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TARGET_PARTS = ("latest", "speculative", "structured", "determinism", "infill")
COLD_FIGURES = {  # cold.json key → label; for each, higher is better or not
    "ready_s": ("serve → ready (s)", False),
    "VmRSS": ("RSS after load", False),
    "cold_prefill_tok_s": ("cold prefill (tok/s)", True),
    "ttft_8_clients_median_s": ("TTFT, 8 clients (s)", False),
}

logger = logging.getLogger("benchmarks.plots")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "figure.dpi": 100})
    return plt


def _target_value(target: str) -> tuple[str, float] | None:
    """('>=', 0.95) from '>= 0.95' or '(>= 0.95: for the record)'."""
    match = re.search(r"([<>]=)\s*([0-9.]+)", target)
    return (match.group(1), float(match.group(2))) if match else None


def plot_targets(part: str, results: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    rows = [row for row in results["targets"] if row.get("ratio") is not None]
    fig, axis = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.2))
    for index, row in enumerate(reversed(rows)):
        colour = "0.6" if row.get("pass") is None else ("tab:green" if row["pass"] else "tab:red")
        axis.barh(index, row["ratio"], color=colour)
        axis.text(row["ratio"], index, f" {row['ratio']:.2f}", va="center", fontsize=8)
        target = _target_value(row.get("target", ""))
        if target:
            axis.plot([target[1]] * 2, [index - 0.4, index + 0.4], color="black", linewidth=1.5)
    axis.set_yticks(range(len(rows)), [_short(row["check"]) for row in reversed(rows)], fontsize=8)
    axis.set_xlabel("measured (black mark: the target)")
    meta = results["meta"]
    axis.set_title(f"{part}: {meta['date']}, commit {meta.get('commit', '?')}", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


def _short(check: str) -> str:
    return check.split(" (prefill left out")[0]


def plot_cold(results: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    ours, peer = results["short"]["ours"], results["short"]["llama-server"]
    labels, ratios = [], []
    for key, (label, higher_is_better) in COLD_FIGURES.items():
        ours_values = [run[key] for run in ours if run.get(key) is not None]
        peer_values = [run[key] for run in peer if run.get(key) is not None]
        if ours_values and peer_values:
            labels.append(label + (" ↑" if higher_is_better else " ↓"))
            ratios.append(statistics.median(ours_values) / statistics.median(peer_values))
    fig, axis = plt.subplots(figsize=(8, 0.5 * len(labels) + 1.2))
    axis.barh(range(len(labels)), ratios, color="tab:blue")
    for index, ratio in enumerate(ratios):
        axis.text(ratio, index, f" {ratio:.2f}", va="center", fontsize=8)
    axis.axvline(1.0, color="black", linewidth=1)
    axis.set_yticks(range(len(labels)), labels)
    axis.set_xlabel("ours / llama-server (↑: higher is better, ↓: lower is better)")
    axis.set_title(f"cold paths: {results['meta']['date']}, {results['rounds']} rounds", fontsize=9)
    axis.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


def plot_throughput(results: dict[str, Any], out: Path) -> None:
    sys.path.insert(0, str(BENCH_DIR))
    from suite.plot import render_plot  # the drawing of latest.png

    render_plot(results, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "results", help="where the results are")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "plots", help="where the plots go")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    def load(name: str) -> dict[str, Any]:
        return json.loads((args.results / f"{name}.json").read_text(encoding="utf-8"))

    written = [args.out / "throughput.png", args.out / "cold.png"]
    plot_throughput(load("latest"), written[0])
    plot_cold(load("cold"), written[1])
    for part in TARGET_PARTS:
        written.append(args.out / f"targets-{part}.png")
        plot_targets(part, load(part), written[-1])
    for path in written:
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
