"""Issue 16 experiment (run on request: `.venv/bin/python benchmarks/experiments/attention_window.py`): what do
other sequences' KV cells cost one sequence's steps?

llama.cpp attends over a window of the unified KV cache — every cell up to the highest one in use, padded to 256 —
whatever sequence the cells belong to (the rest are masked, not skipped). A prefix cache keeps finished sequences'
cells, so one request's steps may read thousands of cells of other sequences. This measures, for a target sequence
with a 1,400-token prompt: the time of an 8-token prefill step (a keystroke's edit) and of one-row decode steps,
with 0 … 6,500 cells of another sequence in the cache, flash attention on and off.
"""

from __future__ import annotations

import ctypes
import statistics
import time

import llama_cpp

MODEL = b"/root/.local/share/edge-llm/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TARGET_TOKENS = 1400
FILLERS = (0, 1000, 2500, 4000, 6500)
DECODE_STEPS = 24


def silence() -> None:
    global _CB
    _CB = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_CB, ctypes.c_void_p(0))


class Ctx:
    def __init__(self, model, flash: int) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 8192, 512, 512, 8
        p.n_threads = p.n_threads_batch = 2
        p.kv_unified = True
        p.flash_attn_type = flash
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        assert self.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(self, rows: list[tuple[int, int, int]]) -> float:
        b = self.batch
        for i, (t, pos, s) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, i == len(rows) - 1
            b.seq_id[i][0] = s
        b.n_tokens = len(rows)
        started = time.perf_counter()
        assert llama_cpp.llama_decode(self.ctx, b) == 0
        return time.perf_counter() - started

    def fill(self, seq: int, n: int, token: int = 1000) -> None:
        for start in range(0, n, 512):
            self.decode([(token + (i % 50), i, seq) for i in range(start, min(n, start + 512))])


def main() -> None:
    silence()
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(MODEL, mp)
    print("| flash | other cells | 8-token prefill ms (median) | decode ms/token (median) |")
    print("|---|---:|---:|---:|")
    for flash in (1, 0):
        ctx = Ctx(model, flash)
        for filler in FILLERS:
            prefills, steps = [], []
            for _ in range(3):
                llama_cpp.llama_memory_clear(ctx.mem, True)
                ctx.fill(0, TARGET_TOKENS)
                if filler:
                    ctx.fill(1, filler, token=3000)
                prefills.append(ctx.decode([(2000 + i, TARGET_TOKENS + i, 0) for i in range(8)]))
                pos = TARGET_TOKENS + 8
                for _ in range(DECODE_STEPS // 3):
                    steps.append(ctx.decode([(2100, pos, 0)]))
                    pos += 1
            print(f"| {'on' if flash else 'off'} | {filler} | {statistics.median(prefills) * 1000:.1f} "
                  f"| {statistics.median(steps) * 1000:.1f} |", flush=True)
        llama_cpp.llama_free(ctx.ctx)


if __name__ == "__main__":
    main()
