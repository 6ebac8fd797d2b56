"""Issue 18 experiment (run on request: `.venv/bin/python benchmarks/experiments/determinism_cost.py`): what do the
bit-invariant configurations found by determinism_levers.py cost?

  today          what the server runs by default: tiled K-quant matmul (ggml-cpu's default), flash attention auto,
                 repacked weights, an f16 KV cache, one KV stream for all sequences
  today-q8       the same with a q8_0 KV cache (--cache-type-k/-v q8_0)
  deterministic  --deterministic: GGML_CPU_TILED_MM=0, flash attention on, no repacking, a q8_0 KV cache (ggml-cpu's
                 flash attention then computes every row alone), one KV stream per sequence; the sequences' ids
                 consecutive, so one step is one micro-batch
  det-scattered  the same with every other sequence id (llama.cpp puts only consecutive ids of separate streams in
                 one micro-batch: each sequence is its own)
  invariant-f16  the flash-off configuration of 1 Dec (f16 KV, two rows a step per sequence: its token and a
                 throw-away row, removed again)

Each configuration runs in a child process (the environment switch is read by ggml once); they alternate, REPEATS
times, and medians are reported: prefill tok/s of a 512-token prompt, decode tok/s (all sequences together) at 1, 4
and 8 sequences, each holding ~190 cells of its own prompt.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
Q8_0, F16 = 8, 1  # ggml_type
CONFIGS = {
    "today": ({}, {"flash": -1, "repack": True, "unified": True, "kv": F16, "throwaway": False, "spacing": 1}),
    "today-q8": ({}, {"flash": -1, "repack": True, "unified": True, "kv": Q8_0, "throwaway": False, "spacing": 1}),
    "deterministic": ({"GGML_CPU_TILED_MM": "0"},
                      {"flash": 1, "repack": False, "unified": False, "kv": Q8_0, "throwaway": False, "spacing": 1}),
    "det-scattered": ({"GGML_CPU_TILED_MM": "0"},
                      {"flash": 1, "repack": False, "unified": False, "kv": Q8_0, "throwaway": False, "spacing": 2}),
    "invariant-f16": ({"GGML_CPU_TILED_MM": "0"},
                      {"flash": 0, "repack": False, "unified": False, "kv": F16, "throwaway": True, "spacing": 1}),
}
REPEATS = 3
SEQUENCES = (1, 4, 8)
STEPS = 24


def child(name: str) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    import llama_cpp
    from determinism_levers import MODEL, PROMPT, Ctx, silence, tokenize

    settings = CONFIGS[name][1]
    silence()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = settings["repack"]
    model = llama_cpp.llama_model_load_from_file(MODEL, params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    ctx = Ctx(model, settings["flash"], settings["unified"], settings["kv"])
    prompt = tokenize(vocab, PROMPT)
    long_prompt = (prompt * 4)[:512]
    out: dict[str, float] = {}
    times = []
    for _ in range(3):
        ctx.clear()
        started = time.perf_counter()
        ctx.prefill(long_prompt, 0)
        times.append(time.perf_counter() - started)
    out["prefill_tok_s"] = len(long_prompt) / statistics.median(times)
    for count in SEQUENCES:
        ctx.clear()
        seqs = [seq * settings["spacing"] for seq in range(count)]
        for seq in seqs:
            ctx.prefill(prompt, seq)
        token, position = prompt[-1], len(prompt)
        started = time.perf_counter()
        for _ in range(STEPS):
            rows = []
            for seq in seqs:
                rows.append((token, position, seq, True))
                if settings["throwaway"]:
                    rows.append((token, position + 1, seq, False))
            ctx.decode(rows)
            if settings["throwaway"]:
                for seq in seqs:
                    llama_cpp.llama_memory_seq_rm(ctx.mem, seq, position + 1, -1)
            position += 1
        out[f"decode_tok_s_{count}"] = count * STEPS / (time.perf_counter() - started)
    return out


def main() -> None:
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    for repeat in range(REPEATS):
        for name, (env, _) in CONFIGS.items():
            done = subprocess.run([sys.executable, __file__, "--child", name], env={**os.environ, **env},
                                  capture_output=True, text=True, check=True)
            measured[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat + 1} {name}: {measured[name][-1]}", flush=True)
    keys = list(measured["today"][0])
    print("\n| configuration | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    base = {key: statistics.median(run[key] for run in measured["today"]) for key in keys}
    for name, runs in measured.items():
        cells = []
        for key in keys:
            value = statistics.median(run[key] for run in runs)
            cells.append(f"{value:.1f}" + ("" if name == "today" else f" ({value / base[key]:.2f}×)"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2])))
    else:
        main()
