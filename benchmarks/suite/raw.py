"""(a) The raw llama-cpp-python decode ceiling: a low-level batched greedy decode loop.

It uses llama_cpp alone, none of this project's code, so that it measures what the library can do and
nothing of ours; llama_cpp is imported on use, as it is not needed to draw the plot.
"""

from __future__ import annotations

import ctypes
import logging
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .measure import measure_quietly
from .plan import NEW_TOKENS, RAW_BATCHES, RAW_PROMPT, THREADS, Plan

logger = logging.getLogger(__name__)


@contextmanager
def raw_model(model: Path, n_seq_max: int) -> Iterator[tuple[Any, Any, Any]]:
    """(model, context, vocab) with the server's context settings; freed on exit."""
    import llama_cpp

    _silence_llama(llama_cpp)
    llama_cpp.llama_backend_init()
    handle = llama_cpp.llama_model_load_from_file(str(model).encode(), llama_cpp.llama_model_default_params())
    if not handle:
        raise RuntimeError(f"could not load {model}")
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 8192, 512, 512
    params.n_seq_max = n_seq_max
    params.n_threads = params.n_threads_batch = THREADS
    params.kv_unified = True
    params.no_perf = True
    ctx = llama_cpp.llama_init_from_model(handle, params)
    try:
        yield handle, ctx, llama_cpp.llama_model_get_vocab(handle)
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(handle)


_LOG_CALLBACK: Any = None


def _silence_llama(llama_cpp: Any) -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


def tokenize(vocab: Any, text: str) -> list[int]:
    import llama_cpp

    data = text.encode()
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), True, True)
    return list(tokens[:count])


def fill_batch(batch: Any, entries: Sequence[tuple[int, int, int, bool]]) -> None:
    """entries: (token, position, seq_id, want_logits)."""
    for i, (token, pos, seq_id, logits) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
        batch.seq_id[i][0] = seq_id
    batch.n_tokens = len(entries)


def decode(ctx: Any, batch: Any) -> None:
    import llama_cpp

    code = llama_cpp.llama_decode(ctx, batch)
    if code != 0:
        raise RuntimeError(f"llama_decode failed with {code}")


def raw_run(ctx: Any, prompt: list[int], n_seqs: int, new_tokens: int) -> dict[str, float]:
    """Prefill `n_seqs` copies of `prompt` in one batch, then decode `new_tokens` greedy tokens each."""
    import llama_cpp

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    samplers = [llama_cpp.llama_sampler_init_greedy() for _ in range(n_seqs)]
    batch = llama_cpp.llama_batch_init(max(512, len(prompt) * n_seqs), 0, 1)
    try:
        started = time.perf_counter()
        fill_batch(batch, [(t, p, s, p == len(prompt) - 1) for s in range(n_seqs) for p, t in enumerate(prompt)])
        decode(ctx, batch)
        last = [llama_cpp.llama_sampler_sample(samplers[s], ctx, (s + 1) * len(prompt) - 1) for s in range(n_seqs)]
        prefilled = time.perf_counter()
        for step in range(new_tokens):
            fill_batch(batch, [(last[s], len(prompt) + step, s, True) for s in range(n_seqs)])
            decode(ctx, batch)
            last = [llama_cpp.llama_sampler_sample(samplers[s], ctx, s) for s in range(n_seqs)]
        finished = time.perf_counter()
    finally:
        llama_cpp.llama_batch_free(batch)
        for sampler in samplers:
            llama_cpp.llama_sampler_free(sampler)
    generated = n_seqs * new_tokens
    return {
        "prefill_s": prefilled - started,
        "decode_s": finished - prefilled,
        "decode_tokens_per_s": generated / (finished - prefilled),
        "end_to_end_tokens_per_s": generated / (finished - started),
    }


class RawLoop:
    """The raw decode loop, loaded once in this process and measured next to each server level.

    A run on this machine drifts by 10-20% within minutes (other virtual machines share the host), so
    the raw figure for B sequences is measured right before and right after our server's B-client level,
    and the ratio uses the median of those runs.
    """

    def __init__(self, ctx: Any, vocab: Any, plan: Plan) -> None:
        self.ctx, self.plan = ctx, plan
        self.prompt = tokenize(vocab, RAW_PROMPT)
        self.end_tokens = end_of_generation_tokens(vocab)
        self.groups: dict[int, list[list[dict[str, Any]]]] = {n: [] for n in RAW_BATCHES}  # one per measure()
        raw_run(ctx, self.prompt, 1, 8)  # warm-up: page the weights in

    def measure(self, n_seqs: int) -> None:
        group = [measure_quietly(f"raw batch {n_seqs}", lambda _: raw_run(self.ctx, self.prompt, n_seqs, NEW_TOKENS),
                                 [], self.plan) for _ in range(self.plan.raw_repeats)]
        self.groups[n_seqs].append(group)
        logger.info("raw batch %d: %.1f tokens/s", n_seqs, group[-1]["decode_tokens_per_s"])

    def results(self, prefix_tokens: int) -> dict[str, Any]:
        batches = [{**summarize_raw(n, len(self.prompt), [run for group in groups for run in group]),
                    "groups": [summarize_raw(n, len(self.prompt), group) for group in groups]}
                   for n, groups in self.groups.items() if groups]
        return {"prompt_tokens": len(self.prompt), "new_tokens": NEW_TOKENS, "batches": batches,
                "shared_prefix_tokens": prefix_tokens, "end_of_generation_tokens": self.end_tokens}


def end_of_generation_tokens(vocab: Any) -> list[int]:
    import llama_cpp

    return [t for t in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, t)]


def summarize_raw(n_seqs: int, prompt_tokens: int, runs: list[dict[str, float]]) -> dict[str, Any]:
    rates = [r["decode_tokens_per_s"] for r in runs]
    return {
        "batch": n_seqs,
        "prompt_tokens": prompt_tokens,
        "decode_tokens_per_s": statistics.median(rates),
        "decode_tokens_per_s_best": max(rates),
        "end_to_end_tokens_per_s": statistics.median(r["end_to_end_tokens_per_s"] for r in runs),
        "prefill_s": statistics.median(r["prefill_s"] for r in runs),
        "neighbour_cpu": max(r["neighbour_cpu"] for r in runs),
        "runs": runs,
    }
