"""The side-by-side benchmark behind benchmarks/run_benchmarks.py (see benchmarks/README.md).

- plan.py       what one run does: the model settings, the client levels, repeats and waits
- raw.py        (a) the raw llama-cpp-python decode loop: llama_cpp only, none of this project's code
- processes.py  our server and llama_cpp.server as processes (edge_llm.testing.server), the peer's venv
- load.py       (b, c, d) load levels and the shared-prefix series against a server (edge_llm.cli.bench)
- measure.py    a quiet machine: wait for idle CPUs, count other processes' CPU time, measure again
- report.py     the paired ratios, the targets and latest.md
- plot.py       latest.png (matplotlib; standard library otherwise, so the peer's Python can draw it)
- run.py        one run from start to end, and its outputs

The parts that run alone (`--only PART`, parts.py): structured.py and structured_report.py (issue 14),
real_client.py (issue 12), keystrokes.py and keystrokes_report.py (infill: the editor's keystroke replay, issue 16),
speculative.py (speculative decoding: off vs ngram vs llama-server ngram-simple, issue 17),
kv_types.py (the KV cache types) and prefix_restart.py (the persistent prefix cache across a restart; both issue 21),
determinism.py (ours by default vs --deterministic: distinct answers and the throughput cost, issue 18),
cold.py (start, first prefill, idle CPU, footprint and a model switch, each server started afresh, issue 40).

Only plan.py and plot.py are imported for `--plot-only`: they need nothing but the standard library
(and matplotlib).
"""
