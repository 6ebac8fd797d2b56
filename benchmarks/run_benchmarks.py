"""Side-by-side throughput and latency benchmark; see benchmarks/README.md.

    .venv/bin/python benchmarks/run_benchmarks.py [--quick] [--skip-peer]
    .venv/bin/python benchmarks/run_benchmarks.py --only structured|real-client|infill [--llama-server PATH]
    .venv/bin/python benchmarks/run_benchmarks.py --only kv-types|prefix-restart|determinism|cold

In one run, on the same model and thread count:
  (a) raw: the llama-cpp-python decode ceiling, a low-level batched greedy decode loop;
  (b) ours: `edge-llm serve --parallel 8` under 1, 4 and 8 streaming clients;
  (c) peer: `python -m llama_cpp.server` (in benchmarks/.venv-peer) under the same load;
  (d) shared prefix: sequential requests sharing a ~800-token system prompt (ours and peer).
(a), (b) and (c) alternate level by level (a paired design: the machine drifts within minutes).
Writes benchmarks/results/latest.{json,md,png}; server logs go to benchmarks/results/*.log.
`--only` runs one of the parts that run alone instead, against ours and llama.cpp's llama-server:
  structured: plain vs json_object, json_schema and a required tool call, and grammar compile costs (issue 14);
  real-client: no max_tokens, a shared ~1,000-token system prompt, 8 clients (issue 12);
  infill: code completion in the editor, a keystroke replay on /infill as llama.vscode drives it: a source file of
    this repository typed again line by line, each keystroke's request cancelling the last (issue 16);
  speculative: ours --speculative off vs ngram, and llama-server --spec-type ngram-simple, on code edits and
    free prose at 1, 4 (and 8) clients (issue 17);
  determinism: ours by default vs --deterministic, repeated greedy and seeded probes in a varying load at 1, 4, 8
    clients: distinct answers and the aggregate throughput cost (issue 18, ours);
  kv-types: memory, decode tok/s and quality against f16 of each KV cache type (--cache-type-k/-v; issue 21, ours);
  prefix-restart: TTFT after a restart with --prefix-cache-dir against warm and cold (issue 21, ours);
  cold: serve → ready, RSS, idle CPU, the first prefill at 1k and 16k tokens, TTFT at 8 clients and a model
    switch, each server started afresh, alternating (issue 40);
each writes benchmarks/results/PART.{json,md}.
The parts live in benchmarks/suite/ (its __init__ lists them).

Only the standard library (with suite/plan.py and suite/plot.py, which need nothing else) is imported
for `--plot-only`, so that it also runs under the peer venv's Python (which has matplotlib).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from suite.plan import RESULTS

PARTS = ("structured", "real-client", "infill", "speculative", "step-cost", "determinism", "kv-types", "prefix-restart",
         "cold")  # suite/parts.py


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats (a few minutes)")
    parser.add_argument("--skip-peer", action="store_true",
                        help="do not run llama_cpp.server (with --only: llama-server)")
    parser.add_argument("--quiet-wait", type=float, default=120.0, metavar="S",
                        help="before each phase, wait up to S seconds for other processes to leave the CPUs "
                        "idle (default: %(default)s; 0 measures at once)")
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF model (default: the one `edge-llm model fetch` downloads)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
    parser.add_argument("--only", choices=PARTS,
                        help="run one part alone and write results/PART.{json,md} (see benchmarks/README.md)")
    parser.add_argument("--clients", type=lambda text: [int(c) for c in text.split(",")], default=None,
                        metavar="LIST", help="client counts of --only structured (default: 1,4,8; --quick: 1,4)")
    parser.add_argument("--workloads", type=lambda text: text.split(","), default=None, metavar="LIST",
                        help="workloads of --only structured (default: all; e.g. plain,json_schema) or of --only "
                        "speculative (code,prose,json,schema)")
    parser.add_argument("--repeats", type=_positive, default=1, metavar="N",
                        help="--only speculative: N times the rounds of each level (one request a client, on the "
                        "servers in turn; at one client one round a task), ratios the median of the rounds' paired "
                        "ratios (default: %(default)s)")
    parser.add_argument("--attempts", type=int, default=None, metavar="N",
                        help="--only: take a disturbed measurement at most N times (default: 3; --quick: 2)")
    parser.add_argument("--llama-server", type=Path, metavar="PATH",
                        help="llama.cpp's llama-server binary for --only (default: $LLAMA_SERVER, else PATH)")
    parser.add_argument("--plot-only", nargs=2, type=Path, metavar=("JSON", "PNG"),
                        help="only render the plot of a results file (used under the peer venv)")
    return parser.parse_args(argv)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGTERM, _exit_on_signal)  # so that the servers we started are stopped
    args = parse_args(argv)
    if args.plot_only:
        from suite.plot import render_plot

        render_plot(json.loads(args.plot_only[0].read_text()), args.plot_only[1])
        return 0
    if args.only:
        from suite.parts import run_part

        sys.stdout.write(run_part(args.only, args))
        return 0
    from suite.report import markdown_report
    from suite.run import run, write_outputs

    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(results, args.out)
    sys.stdout.write(markdown_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
