"""`--only kv-types` (issue 21): what each KV cache type (`--cache-type-k/-v`) costs and gives, against f16.

For each type pair:
- memory: the estimate (edge-llm model info), the server's KV gauge, and the server's resident memory once it
  has served a ~900-token prompt (llama.cpp allocates the whole KV buffer at start);
- decode speed: one stream of 64 greedy tokens (end tokens banned) after a ~900-token prompt from the prefix
  cache, and 4 such streams at once (their tokens per second of decode, from the answers' timings);
- quality, in this process with llama_cpp alone (as raw.py): a fixed text (the start of
  docs/speculative.md, 1,024 tokens; before 4 Dec 2026 the README's, which became too short) decoded teacher-forced, its mean log-likelihood per token and each position's greedy
  (argmax) token; against f16: the share of positions with the same greedy token and the mean log-likelihood
  difference; and the server's greedy answer of 64 tokens, how many tokens it agrees with f16's from the start.
"""

from __future__ import annotations

import ctypes
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from edge_llm.models.gguf_info import read_model_facts
from edge_llm.testing.server import run_server

from .load import shared_prefix_text
from .plan import REPO, RESULTS, THREADS, Plan
from .raw import _silence_llama

logger = logging.getLogger(__name__)

TYPES = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"))  # --quick: the first three
CTX = 8192
QUALITY_TOKENS = 1024
QUALITY_TEXT = "docs/speculative.md"  # prose of this repository, at least QUALITY_TOKENS long
ANSWER_TOKENS = 64
AGREEMENT_TOKENS = 64
QUESTION = "Summarize rule 3 in one sentence, then list the rules about tests."


def label(type_k: str, type_v: str) -> str:
    return type_k if type_k == type_v else f"K {type_k} / V {type_v}"


# ---- quality, in process ---------------------------------------------------------------------------------------


def quality_text_tokens(llama_cpp: Any, vocab: Any) -> list[int]:
    data = (REPO / QUALITY_TEXT).read_text(encoding="utf-8").encode()
    tokens = (llama_cpp.llama_token * (len(data) + 8))()
    count = llama_cpp.llama_tokenize(vocab, data, len(data), tokens, len(tokens), False, False)
    return list(tokens[:min(count, QUALITY_TOKENS)])


def teacher_forced(model: Path, type_k: str, type_v: str) -> dict[str, Any]:
    """Each position's log-likelihood of the next token of the fixed text, and its argmax token."""
    import llama_cpp

    from edge_llm.engine.llama.kv_types import KV_TYPES

    _silence_llama(llama_cpp)
    llama_cpp.llama_backend_init()
    handle = llama_cpp.llama_model_load_from_file(str(model).encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 2048, 256, 256, 1
    params.n_threads = params.n_threads_batch = THREADS
    params.type_k, params.type_v = KV_TYPES[type_k].ggml_type, KV_TYPES[type_v].ggml_type
    params.no_perf = True
    ctx = llama_cpp.llama_init_from_model(handle, params)
    vocab = llama_cpp.llama_model_get_vocab(handle)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    tokens = quality_text_tokens(llama_cpp, vocab)
    batch = llama_cpp.llama_batch_init(256, 0, 1)
    loglik: list[float] = []
    greedy: list[int] = []
    started = time.perf_counter()
    try:
        for start in range(0, len(tokens) - 1, 256):
            chunk = tokens[start:min(start + 256, len(tokens) - 1)]
            for i, token in enumerate(chunk):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, True
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(chunk)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            for i in range(len(chunk)):
                pointer = llama_cpp.llama_get_logits_ith(ctx, i)
                logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (n_vocab,))
                top = float(logits.max())
                log_norm = top + float(np.log(np.exp(logits - top).sum()))
                loglik.append(float(logits[tokens[start + i + 1]]) - log_norm)
                greedy.append(int(logits.argmax()))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(handle)
    return {"tokens": len(tokens), "loglik": loglik, "greedy": greedy, "seconds": time.perf_counter() - started}


# ---- the server --------------------------------------------------------------------------------------------


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def end_tokens(url: str) -> list[int]:
    """The model's end-of-generation tokens, to ban them (every answer runs to max_tokens)."""
    found = []
    for text in ("<|im_end|>", "<|endoftext|>"):
        response = httpx.post(url + "/tokenize", json={"content": text, "parse_special": True}, timeout=30).json()
        found += response["tokens"] if response["count"] == 1 else []
    return found


def stream_rate(url: str, prompt: str, banned: list[int]) -> float:
    body = {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": QUESTION}],
            "temperature": 0, "max_tokens": ANSWER_TOKENS, "logit_bias": {str(t): -100 for t in banned}}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
    decode_s = answer["timings"]["decode_ms"] / 1000
    return (answer["usage"]["completion_tokens"] - 1) / decode_s


def greedy_answer(url: str, prompt: str) -> list[int]:
    body = {"prompt": prompt[:1000] + "\n\nRule 25:", "temperature": 0, "max_tokens": AGREEMENT_TOKENS, "logprobs": 1,
            "cache_prompt": False}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=600).json()
    return [token for token in answer["choices"][0]["logprobs"]["tokens"]]


def serve_and_measure(model: Path, type_k: str, type_v: str, prompt: str, plan: Plan) -> dict[str, Any]:
    with run_server(RESULTS, "--parallel", "4", "--ctx-size", str(CTX), "--cache-type-k", type_k,
                    "--cache-type-v", type_v, "--log-level", "warning", model=model, threads=THREADS,
                    startup_timeout=300, log_name=f"kv-{type_k}-{type_v}.log") as server:
        rss_start = resident_bytes(server.process.pid)
        banned = end_tokens(server.url)
        stream_rate(server.url, prompt, banned)  # the prompt goes into the prefix cache; pages warm
        single = [stream_rate(server.url, prompt, banned) for _ in range(1 if plan.quick else 2)]
        with ThreadPoolExecutor(4) as pool:
            started = time.perf_counter()
            rates = list(pool.map(lambda _: stream_rate(server.url, prompt, banned), range(4)))
            wall = time.perf_counter() - started
        answer = greedy_answer(server.url, prompt)
        return {
            "kv_bytes_gauge": gauge(server.url, "edge_llm_kv_cache_bytes_total"),
            "rss_start_bytes": rss_start,
            "rss_after_bytes": resident_bytes(server.process.pid),
            "decode_tok_s_1": statistics.median(single),
            "decode_tok_s_4_each": statistics.median(rates),
            "tok_s_4_aggregate": 4 * ANSWER_TOKENS / wall,
            "answer_tokens": answer,
        }


def run_kv_types(model: Path, plan: Plan, checkpoint: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """Quality of every type first (in process), then each type's server; `checkpoint(results)` after each step, so
    that a run cut short keeps what it measured."""
    facts = read_model_facts(model)
    prompt = shared_prefix_text(24)
    results: dict[str, Any] = {"types": []}
    positions: list[dict[str, Any]] = []
    for type_k, type_v in TYPES[:3] if plan.quick else TYPES:
        logger.info("KV cache %s: quality", label(type_k, type_v))
        row: dict[str, Any] = {"type_k": type_k, "type_v": type_v, "label": label(type_k, type_v),
                               "kv_bytes_estimate": facts.memory(CTX, n_seq=12, cache_type_k=type_k,
                                                                 cache_type_v=type_v).kv_cache_bytes}
        quality = teacher_forced(model, type_k, type_v)
        positions.append({"loglik": quality.pop("loglik"), "greedy": quality.pop("greedy")})
        row["quality"] = quality
        ours, base = positions[-1], positions[0]
        row["greedy_agreement"] = sum(a == b for a, b in zip(ours["greedy"], base["greedy"])) / len(base["greedy"])
        row["mean_loglik"] = statistics.fmean(ours["loglik"])
        row["mean_loglik_diff"] = row["mean_loglik"] - statistics.fmean(base["loglik"])
        row["quality_tokens"] = quality["tokens"]
        row["quality_text"] = QUALITY_TEXT
        results["types"].append(row)
        checkpoint(results)
    for row in results["types"]:
        logger.info("KV cache %s: server", row["label"])
        row.update(serve_and_measure(model, row["type_k"], row["type_v"], prompt, plan))
        reference = results["types"][0]["answer_tokens"]
        row["answer_agreeing_tokens"] = next(
            (i for i, (a, b) in enumerate(zip(row["answer_tokens"], reference)) if a != b),
            min(len(row["answer_tokens"]), len(reference)))
        checkpoint(results)
    return results


def kv_types_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    first = results["types"][0]
    lines = [
        "# KV cache types (`--only kv-types`)",
        "",
        f"{meta['date']}, {meta['model']}, {meta['threads']} threads, commit {meta['commit']}; context {CTX:,} cells, "
        f"`--parallel 4`. Decode: {ANSWER_TOKENS} greedy tokens after a ~900-token prompt (from the prefix cache). "
        f"Quality: {first.get('quality_tokens', QUALITY_TOKENS)} tokens of {first.get('quality_text', 'README.md')} "
        "teacher-forced, against f16; the answer: a 64-token greedy completion, tokens equal to f16's from the start.",
        "",
        "| KV cache | KV estimate | KV gauge | RSS after | decode tok/s (1) | tok/s each (4) | tok/s total (4) "
        "| greedy agreement | mean log-lik | Δ log-lik vs f16 | answer tokens = f16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["types"]:
        served = "decode_tok_s_1" in row
        server = (f"{row['kv_bytes_gauge'] / 2**20:.1f} MiB | {row['rss_after_bytes'] / 2**20:.0f} MiB "
                  f"| {row['decode_tok_s_1']:.1f} | {row['decode_tok_s_4_each']:.1f} | {row['tok_s_4_aggregate']:.1f}"
                  if served else "not measured | | | |")
        answer = f"{row['answer_agreeing_tokens']} of {AGREEMENT_TOKENS}" if served else "not measured"
        lines.append(
            f"| {row['label']} | {row['kv_bytes_estimate'] / 2**20:.1f} MiB | {server} "
            f"| {row['greedy_agreement'] * 100:.1f}% | {row['mean_loglik']:.4f} "
            f"| {row['mean_loglik_diff']:+.4f} | {answer} |")
    return "\n".join(lines) + "\n"
