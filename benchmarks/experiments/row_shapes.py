"""Issues 16 and 17 experiment (run on request: `.venv/bin/python benchmarks/experiments/row_shapes.py`): what does
a `llama_decode` of n rows cost, n = 1 … 12?

A keystroke's request computes a few prompt tokens (2–4), a drafted step 1 + k rows. llama.cpp's CPU backend
repacks the quantized weights for a kernel that multiplies them with 4 rows at a time (a GEMM) and takes the rows
left over one by one (a GEMV, which reads the weights again), so the cost of n rows need not grow smoothly with n.
One sequence holds 1,400 cells; each step adds n rows after them (the last with logits) and removes them again.
Medians of 9 steps per n, with the weights repacked (the server's setting) and not.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time

import llama_cpp

MODEL = b"/root/.local/share/edge-llm/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
CONTEXT = 1400
ROWS = tuple(range(1, 13))
REPEATS = 9


def silence() -> None:
    global _CB
    _CB = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_CB, ctypes.c_void_p(0))


def measure(repack: bool) -> dict[int, float]:
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = repack
    model = llama_cpp.llama_model_load_from_file(MODEL, params)
    p = llama_cpp.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 4096, 512, 512, 1
    p.n_threads = p.n_threads_batch = 2
    p.kv_unified = True
    p.no_perf = True
    ctx = llama_cpp.llama_init_from_model(model, p)
    memory = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(tokens: list[int], start: int) -> float:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, i == len(tokens) - 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        started = time.perf_counter()
        assert llama_cpp.llama_decode(ctx, batch) == 0
        return time.perf_counter() - started

    for start in range(0, CONTEXT, 512):
        decode([1000 + i % 50 for i in range(start, min(CONTEXT, start + 512))], start)
    times: dict[int, list[float]] = {n: [] for n in ROWS}
    for _ in range(REPEATS):
        for n in ROWS:  # interleaved, so a slow spell of the machine touches every n alike
            times[n].append(decode([2000 + i for i in range(n)], CONTEXT))
            llama_cpp.llama_memory_seq_rm(memory, 0, CONTEXT, -1)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {n: statistics.median(values) * 1000 for n, values in times.items()}


def main() -> None:
    silence()
    llama_cpp.llama_backend_init()
    results = {repack: measure(repack) for repack in (True, False)}
    print("| rows | repacked: ms | ms a row | not repacked: ms | ms a row |")
    print("|---:|---:|---:|---:|---:|")
    for n in ROWS:
        on, off = results[True][n], results[False][n]
        print(f"| {n} | {on:.1f} | {on / n:.1f} | {off:.1f} | {off / n:.1f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
