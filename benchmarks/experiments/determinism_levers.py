"""Issue 18 experiment (run on request: `.venv/bin/python benchmarks/experiments/determinism_levers.py`): which levers change the logits of the same position, bit for bit?

For one target sequence (a prompt, then greedy tokens), the logits of its last prompt position and of a
few decode positions are computed under different conditions and compared bitwise against a cold,
alone, one-batch reference computed in the same context configuration:

  chunked    the prompt in chunks of 64 tokens
  warm       the first 3/4 of the prompt computed in another sequence, seq_cp'd, the rest computed
  displaced  600 cells of another sequence in the cache first (the target's cells land elsewhere)
  beside-k   each decode step shares its batch with k other sequences' rows (k = 1, 3, 4, 7)

Configurations: flash attention on/off x repacked weights (use_extra_bufts) on/off x kv_unified on/off.
`--rows FLASH REPACK UNIFIED` runs the follow-up of one configuration: rows beside, prefill remainders, and the KV
of generated tokens. `--answer FLASH REPACK UNIFIED` compares an answer's tokens decoded one row a step, decoded two
rows a step (the token and a throw-away row after it, removed again) and prefilled in one batch. Set
GGML_CPU_TILED_MM=0 in the environment to switch off ggml-cpu's tiled K-quant matmul (used from 8 rows on). The
results and what they mean are in docs/determinism.md.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import time

import numpy as np
import llama_cpp

MODEL = b"/root/.local/share/edge-llm/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PROMPT = ("You are a careful assistant. Explain, step by step, how a hash map handles collisions, "
          "with a short Python example and a note on load factors. ") * 6
DECODE = 6
N_SEQ = 16


def silence() -> None:
    global _CB
    _CB = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_CB, ctypes.c_void_p(0))


def tokenize(vocab, text: str) -> list[int]:
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
    return list(buf[:n])


# `--kv q8_0` anywhere in the arguments: the KV cache in q8_0 (K and V) instead of f16. With a quantized cache, ggml-cpu's
# flash attention takes neither its KV-split path (one row, >= 512 cells) nor its tiled one (>= 64 rows): every row is
# computed alone, over its sequence's cells in cell order.
KV_TYPE = llama_cpp.GGML_TYPE_Q8_0 if "q8_0" in sys.argv else llama_cpp.GGML_TYPE_F16
if "--kv" in sys.argv:
    del sys.argv[sys.argv.index("--kv"):sys.argv.index("--kv") + 2]


class Ctx:
    def __init__(self, model, flash: int, unified: bool, kv_type: int | None = None) -> None:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 8192 if unified else 8192 * N_SEQ // 8, 512, 512, N_SEQ
        p.n_threads = p.n_threads_batch = 2
        p.kv_unified = unified
        p.flash_attn_type = flash
        p.type_k = p.type_v = KV_TYPE if kv_type is None else kv_type
        p.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, p)
        assert self.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.mem, True)

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> dict[int, np.ndarray]:
        """rows: (token, pos, seq, want_logits) -> {row index: logits copy}"""
        b = self.batch
        for i, (t, pos, s, want) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, want
            b.seq_id[i][0] = s
        b.n_tokens = len(rows)
        assert llama_cpp.llama_decode(self.ctx, b) == 0
        out = {}
        for i, (_, _, _, want) in enumerate(rows):
            if want:
                ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
                out[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return out

    def prefill(self, tokens: list[int], seq: int, start: int = 0, chunk: int = 512) -> np.ndarray:
        last = None
        for lo in range(start, len(tokens), chunk):
            hi = min(lo + chunk, len(tokens))
            rows = [(tokens[p], p, seq, p == len(tokens) - 1) for p in range(lo, hi)]
            got = self.decode(rows)
            if got:
                last = next(iter(got.values()))
        return last

    def run(self, prompt: list[int], seq: int, *, chunk: int = 512, warm: bool = False, beside: int = 0,
            others: dict[int, list[int]] | None = None, after_prefill=None,
            forced: list[int] | None = None) -> list[np.ndarray]:
        """Logits at the last prompt position and DECODE greedy steps."""
        if warm:
            cut = len(prompt) * 3 // 4
            self.prefill(prompt[:cut], N_SEQ - 1, chunk=chunk)
            llama_cpp.llama_memory_seq_cp(self.mem, N_SEQ - 1, seq, -1, -1)
            logits = [self.prefill(prompt, seq, start=cut, chunk=chunk)]
        else:
            logits = [self.prefill(prompt, seq, chunk=chunk)]
        if after_prefill:
            after_prefill()
        others = others or {}
        tok = forced[0] if forced else int(np.argmax(logits[-1]))
        pos = len(prompt)
        other_last = {s: (toks[-1], len(toks)) for s, toks in others.items()}
        for _ in range(DECODE):
            rows = [(tok, pos, seq, True)]
            extra = list(other_last.items())[:beside]
            for s, (t, p) in extra:
                rows.append((t, p, s, True))
            got = self.decode(rows)
            logits.append(got[0])
            for i, (s, (t, p)) in enumerate(extra, start=1):
                other_last[s] = (int(np.argmax(got[i])), p + 1)
            tok = forced[len(logits) - 1] if forced else int(np.argmax(got[0]))
            pos += 1
        return logits


def compare(ref: list[np.ndarray], got: list[np.ndarray]) -> str:
    same = [np.array_equal(a, b) for a, b in zip(ref, got)]
    argmax = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(ref, got)]
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, got))
    return f"bit-equal {sum(same)}/{len(same)}  argmax-equal {sum(argmax)}/{len(argmax)}  max|d| {worst:.2e}"


def main() -> None:
    configs = list(itertools.product((1, 0), (True, False), (True, False)))
    only = sys.argv[1:]  # e.g. "flash=off" to run only the configurations whose name contains it
    for flash, repack, unified in configs:
        name = f"flash={'on' if flash else 'off'} repack={'on' if repack else 'off'} unified={unified}"
        if only and not any(o in name for o in only):
            continue
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = repack
        model = llama_cpp.llama_model_load_from_file(MODEL, mp)
        vocab = llama_cpp.llama_model_get_vocab(model)
        prompt = tokenize(vocab, PROMPT)
        filler = tokenize(vocab, "Some unrelated text about gardening and the weather. " * 60)[:600]
        c = Ctx(model, flash, unified)
        started = time.perf_counter()
        c.clear()
        ref = c.run(prompt, 0)
        cold_s = time.perf_counter() - started
        f = [int(np.argmax(x)) for x in ref]
        run = c.run
        c.run = lambda *a, **k: run(*a, forced=f, **k)
        results = {}
        c.clear(); results["again"] = c.run(prompt, 0)
        c.clear(); results["chunked64"] = c.run(prompt, 0, chunk=64)
        c.clear(); results["warm"] = c.run(prompt, 0, warm=True)
        c.clear(); c.prefill(filler, 5); results["displaced"] = c.run(prompt, 0)
        c.clear(); c.prefill(filler, 5); results["other-seq-id"] = c.run(prompt, 3)
        for k in (1, 3, 4, 7):
            c.clear()
            others = {1 + j: tokenize(vocab, f"Question {j}: list {j + 3} prime numbers and explain.")
                      for j in range(k)}

            def fill_others() -> None:
                for s, toks in others.items():
                    c.prefill(toks, s)
            results[f"beside-{k}"] = c.run(prompt, 0, beside=k, others=others, after_prefill=fill_others)
        print(f"== {name}  (prompt {len(prompt)} tokens, cold run {cold_s:.2f}s)", flush=True)
        for key, got in results.items():
            print(f"   {key:13s} {compare(ref, got)}", flush=True)
        llama_cpp.llama_free(c.ctx)
        llama_cpp.llama_model_free(model)


def beside(c: Ctx, vocab, prompt: list[int], k: int, forced: list[int]) -> list[np.ndarray]:
    """The target's logits with each decode step shared with k other sequences' rows (in an empty cache)."""
    c.clear()
    others = {1 + j: tokenize(vocab, f"Question {j}: list {j + 3} prime numbers and explain.") for j in range(k)}

    def fill() -> None:
        for s, toks in others.items():
            c.prefill(toks, s)
    return c.run(prompt, 0, beside=k, others=others, after_prefill=fill, forced=forced)


def rows_and_remainders(flash: int, repack: bool, unified: bool) -> None:
    """How many rows beside, small prefill remainders after a cached prefix, and the KV of generated tokens
    (decoded one a step) against the same tokens prefilled in one batch."""
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = llama_cpp.llama_model_load_from_file(MODEL, mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    prompt = tokenize(vocab, PROMPT)
    c = Ctx(model, flash, unified)
    c.clear()
    ref = c.run(prompt, 0)
    forced = [int(np.argmax(x)) for x in ref]
    print(f"flash={flash} repack={repack} unified={unified}")
    for k in (4, 5, 6, 7, 8):
        print(f"  beside-{k}: {compare(ref, beside(c, vocab, prompt, k, forced))}", flush=True)
    for rem in (1, 2, 3, 4, 5, 8, 17):
        c.clear()
        cut = len(prompt) - rem
        c.prefill(prompt[:cut], 9)
        llama_cpp.llama_memory_seq_cp(c.mem, 9, 0, -1, -1)
        first = c.prefill(prompt, 0, start=cut)
        print(f"  warm remainder {rem}: {compare(ref[:1], [first])}", flush=True)
    # generated tokens' KV: prompt + forced[:DECODE-1] prefilled in one batch; compare with ref's decode logits
    c.clear()
    full = prompt + forced[:DECODE]
    last = c.prefill(full, 0)
    print(f"  prefilled answer vs decoded: {compare(ref[DECODE:DECODE + 1], [last])}", flush=True)


def answer_kv(flash: int, repack: bool, unified: bool) -> None:
    """The logits (and so the KV) of an answer's tokens: decoded one row a step, decoded two rows a step (the token
    plus a throw-away row after it in the same sequence, removed by seq_rm before the next step), and prefilled in
    one batch with logits on every row; then a follow-up turn prefilled after each, compared too."""
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = llama_cpp.llama_model_load_from_file(MODEL, mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    prompt = tokenize(vocab, PROMPT)
    follow = tokenize(vocab, "Thanks. Now show the same with open addressing and linear probing.")
    c = Ctx(model, flash, unified)
    c.clear()
    forced = [int(np.argmax(x)) for x in c.run(prompt, 0)]
    answer = forced[:DECODE]

    def follow_up(start: int) -> list[np.ndarray]:
        got = c.decode([(t, start + i, 0, True) for i, t in enumerate(follow)])
        return [got[i] for i in sorted(got)]

    c.clear()
    rows = [(t, p, 0, p >= len(prompt) - 1) for p, t in enumerate(prompt + answer)]
    got = c.decode(rows)
    prefilled = [got[i] for i in sorted(got)][:DECODE]  # the last prompt position and the answer's but the last
    prefilled_next = follow_up(len(rows))
    for label, throwaway in (("1 row a step", False), ("2 rows a step", True)):
        c.clear()
        logits = [c.prefill(prompt, 0)]
        for i, tok in enumerate(answer):
            pos = len(prompt) + i
            step = [(tok, pos, 0, True)] + ([(tok, pos + 1, 0, False)] if throwaway else [])
            logits.append(c.decode(step)[0])
            if throwaway:
                llama_cpp.llama_memory_seq_rm(c.mem, 0, pos + 1, -1)
        print(f"  answer {label} vs prefilled: logits {compare(prefilled[1:], logits[1:DECODE])}; "
              f"follow-up turn {compare(prefilled_next, follow_up(len(prompt) + DECODE))}", flush=True)


def long_and_drafted(flash: int, repack: bool, unified: bool) -> None:
    """A prompt of ~750 tokens (a window of >= 512 cells: flash attention's KV-split path for one row alone): decode
    alone against beside 1 and 3 other sequences, the prompt in 64-token chunks, a warm prefix, and the decode steps
    carrying 1 or 3 draft rows (the forced next tokens) instead of one row a step."""
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = llama_cpp.llama_model_load_from_file(MODEL, mp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    prompt = tokenize(vocab, PROMPT * 4)
    c = Ctx(model, flash, unified)
    c.clear()
    ref = c.run(prompt, 0)
    forced = [int(np.argmax(x)) for x in ref]
    print(f"flash={flash} repack={repack} unified={unified} kv={'q8_0' if KV_TYPE == llama_cpp.GGML_TYPE_Q8_0 else 'f16'} "
          f"prompt {len(prompt)} tokens", flush=True)
    for k in (1, 3):
        print(f"  beside-{k}: {compare(ref, beside(c, vocab, prompt, k, forced))}", flush=True)
    c.clear()
    print(f"  chunked64: {compare(ref, c.run(prompt, 0, chunk=64, forced=forced))}", flush=True)
    c.clear()
    print(f"  warm: {compare(ref, c.run(prompt, 0, warm=True, forced=forced))}", flush=True)
    for drafts in (1, 3):
        c.clear()
        logits = [c.prefill(prompt, 0)]
        pos = len(prompt)
        while len(logits) < DECODE + 1:
            step = forced[len(logits) - 1:len(logits) + drafts]
            got = c.decode([(t, pos + i, 0, True) for i, t in enumerate(step)])
            logits.extend(got[i] for i in sorted(got))
            pos += len(step)
        print(f"  {drafts} draft rows a step: {compare(ref, logits[:DECODE + 1])}", flush=True)


if __name__ == "__main__":
    silence()
    llama_cpp.llama_backend_init()
    if sys.argv[1:2] == ["--rows"]:  # --rows FLASH REPACK UNIFIED, e.g. --rows 0 0 0
        rows_and_remainders(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1")
    elif sys.argv[1:2] == ["--long"]:  # --long FLASH REPACK UNIFIED, e.g. --long 1 0 0 --kv q8_0
        long_and_drafted(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1")
    elif sys.argv[1:2] == ["--answer"]:  # --answer FLASH REPACK UNIFIED, e.g. --answer 0 0 0
        answer_kv(int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1")
    else:
        main()
