"""Side-by-side throughput and latency benchmark; see benchmarks/README.md.

    .venv/bin/python benchmarks/run_benchmarks.py [--quick] [--skip-peer]

In one run, on the same model and thread count:
  (a) raw: the llama-cpp-python decode ceiling, a low-level batched greedy decode loop;
  (b) ours: `edge-llm serve --parallel 8` under 1, 4 and 8 streaming clients;
  (c) peer: `python -m llama_cpp.server` (in benchmarks/.venv-peer) under the same load;
  (d) shared prefix: sequential requests sharing a ~800-token system prompt (ours and peer).
(a), (b) and (c) alternate level by level (a paired design: the machine drifts within minutes).
Writes benchmarks/results/latest.{json,md,png}; server logs go to benchmarks/results/*.log.

Only the standard library is imported at module level, so that `--plot-only` also runs
under the peer venv's Python (which has matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger("run_benchmarks")

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
PEER_VENV = BENCH_DIR / ".venv-peer"
PEER_REQUIREMENTS = ("llama-cpp-python[server]==0.3.36", "matplotlib==3.11.2")

THREADS = 2
CLIENT_LEVELS = (1, 4, 8)
RAW_BATCHES = (1, 4, 8)
NEW_TOKENS = 64
SERVER_PARALLEL = 8
RAW_PROMPT = ("You are a helpful coding assistant. Answer the question with working code.\n"
              "Question: write a Python function that returns the n-th Fibonacci number.\nAnswer:")
PREFIX_QUESTIONS = (
    "Which rule is about naming?",
    "Summarize rule 3 in one sentence.",
    "How many rules mention tests?",
    "What does the guide say about logging?",
    "Which rule covers error handling?",
    "Give one rule about documentation.",
    "What is the first rule?",
    "Name a rule about performance.",
)


@dataclass(frozen=True)
class Plan:
    """How much of everything one run does."""

    quick: bool
    raw_repeats: int
    rounds_per_client: int
    min_requests: int
    warmup: int
    prefix_requests: int
    level_repeats: int = 3  # our levels, each between two raw measurements (a paired design)
    quiet_wait_s: float = 120.0
    attempts: int = 3  # a measurement disturbed by other processes is taken again, at most this often
    prefix_max_tokens: int = 8

    @classmethod
    def make(cls, quick: bool, quiet_wait_s: float) -> Plan:
        if quick:
            return cls(quick=True, raw_repeats=1, rounds_per_client=2, min_requests=4, warmup=1, prefix_requests=4,
                       level_repeats=1,
                       quiet_wait_s=quiet_wait_s, attempts=2)
        return cls(quick=False, raw_repeats=2, rounds_per_client=4, min_requests=8, warmup=2, prefix_requests=6,
                   quiet_wait_s=quiet_wait_s)

    def requests_for(self, clients: int) -> int:
        return max(self.min_requests, self.rounds_per_client * clients)


# ---- (a) the raw llama-cpp-python decode ceiling -----------------------------------------------------


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


def full_length_body(end_tokens: Sequence[int]) -> dict[str, Any]:
    """Request fields that ban the end-of-generation tokens (OpenAI `logit_bias`, -100 bans), so that every
    answer runs to max_tokens like the raw loop's sequences; both servers get the same body."""
    return {"logit_bias": {str(t): -100 for t in end_tokens}}


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


# ---- a quiet machine ------------------------------------------------------------------------------------


def cpu_busy_fraction(interval_s: float = 2.0) -> float:
    """The share of all CPU time that was busy over `interval_s` (from /proc/stat; 0.0 elsewhere)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(interval_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_for_quiet(phase: str, max_wait_s: float, threshold: float = 0.25) -> float:
    """Waits (at most `max_wait_s`) until other processes leave the CPUs mostly idle; returns the last busy share.

    Two llama.cpp threads on two cores slow down several-fold when anything else runs, so a
    phase measured on a busy machine says more about the neighbours than about the code.
    """
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_fraction()
    while busy > threshold and time.monotonic() < deadline:
        logger.info("%s: waiting for a quiet machine (CPU %.0f%% busy)", phase, busy * 100)
        time.sleep(5)
        busy = cpu_busy_fraction()
    if busy > threshold:
        logger.warning("%s: measuring on a busy machine (CPU %.0f%% busy)", phase, busy * 100)
    return busy


def _cpu_jiffies() -> tuple[int, int]:
    """(total, busy) CPU time of the machine so far, all cores."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields), sum(fields) - idle


def _process_jiffies(pid: int) -> int:
    """utime + stime of a process (all its threads); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


class CpuWatch:
    """The share of the machine's CPU time used by other processes than ours during a block."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = [os.getpid(), *pids]
        self.neighbour_share = 0.0

    def _own(self) -> int:
        return sum(_process_jiffies(pid) for pid in self.pids)

    def __enter__(self) -> CpuWatch:
        self._start = (*_cpu_jiffies(), self._own())
        return self

    def __exit__(self, *exc: object) -> None:
        total, busy = _cpu_jiffies()
        own = self._own()
        elapsed = total - self._start[0]
        others = (busy - self._start[1]) - (own - self._start[2])
        self.neighbour_share = max(0.0, others / elapsed) if elapsed > 0 else 0.0


MeasureResult = TypeVar("MeasureResult", bound=dict)


def measure_quietly(label: str, measure: Callable[[int], MeasureResult], pids: Sequence[int], plan: Plan,
                    threshold: float = 0.15) -> MeasureResult:
    """Runs `measure(attempt)` on a quiet machine; again (at most `plan.attempts` times in all) while other
    processes used more than `threshold` of the CPUs meanwhile. Returns the least disturbed attempt,
    with `neighbour_cpu` (that share) and `attempts` added."""
    best: dict[str, Any] | None = None
    for attempt in range(1, plan.attempts + 1):
        wait_for_quiet(label, plan.quiet_wait_s)
        with CpuWatch(pids) as watch:
            result = measure(attempt)
        result = {**result, "neighbour_cpu": watch.neighbour_share, "attempts": attempt}
        if best is None or watch.neighbour_share < best["neighbour_cpu"]:
            best = result
        if watch.neighbour_share <= threshold:
            break
        again = "; measuring again" if attempt < plan.attempts else "; keeping the least disturbed try"
        logger.warning("%s: other processes used %.0f%% of the CPUs meanwhile%s", label,
                       watch.neighbour_share * 100, again)
    return best  # type: ignore[return-value]


# ---- servers -------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready at {url} after {timeout_s:.0f}s")


def wait_until_serving(base_url: str, timeout_s: float = 180) -> None:
    """Healthy is not always ready (a model may still be loading): wait for a 1-token completion."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout_s
    while True:
        request = urllib.request.Request(base_url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


@contextmanager
def server(name: str, command: list[str], health_url: str) -> Iterator[subprocess.Popen[bytes]]:
    log_path = RESULTS / f"{name}.log"
    logger.info("starting %s: %s (log: %s)", name, " ".join(command), log_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            wait_until_up(health_url, process, timeout_s=180)
            yield process
        finally:
            stop_process(process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def ours_command(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "edge_llm", "serve", "--model", str(model), "--threads", str(THREADS),
            "--parallel", str(SERVER_PARALLEL), "--port", str(port), "--log-level", "warning"]


def peer_command(model: Path, port: int) -> list[str]:
    return [str(peer_python()), "-m", "llama_cpp.server", "--model", str(model), "--n_threads", str(THREADS),
            "--n_threads_batch", str(THREADS), "--interrupt_requests", "False", "--host", "127.0.0.1",
            "--port", str(port)]


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peer_venv() -> Path:
    """benchmarks/.venv-peer with llama_cpp.server and matplotlib, created when missing."""
    python = peer_python()
    check = [str(python), "-c", "import llama_cpp.server, matplotlib"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    logger.info("creating %s with %s", PEER_VENV, ", ".join(PEER_REQUIREMENTS))
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    return python


# ---- (b), (c), (d): load against a server ------------------------------------------------------------


def shared_prefix_text() -> str:
    """A ~800-token system prompt of distinct, numbered rules."""
    topics = ("naming", "tests", "logging", "error handling", "documentation", "performance", "security",
              "dependencies", "formatting", "reviews", "releases", "configuration")
    rules = [
        f"Rule {i + 1}: when you work on {topics[i % len(topics)]} in module number {i * 7 + 3}, keep each "
        f"change small, explain the reason for it, and check case {i * 13 % 97} before you finish."
        for i in range(24)
    ]
    return "You are the code-review assistant of a small team. Follow these house rules.\n" + "\n".join(rules)


@dataclass
class LoadTarget:
    """A running server under test, with its bench settings and what was measured on it."""

    name: str
    pid: int
    config: Any  # edge_llm.bench.BenchConfig
    repeats: dict[int, list[dict[str, Any]]]


def prepare_target(name: str, base_url: str, pid: int, plan: Plan, extra_body: dict[str, Any]) -> LoadTarget:
    """Discovers the model id and sends the warm-up requests."""
    from edge_llm import bench

    config = bench.BenchConfig(base_url=base_url, max_tokens=NEW_TOKENS, temperature=0.0)
    config = bench.BenchConfig(base_url=base_url, max_tokens=NEW_TOKENS, temperature=0.0,
                               model=asyncio.run(bench.discover_model(config)), extra_body=extra_body)
    if plan.warmup:
        asyncio.run(bench.run_level(config, 1, plan.warmup, list(bench.DEFAULT_PROMPTS), tag="warmup"))
    return LoadTarget(name, pid, config, {clients: [] for clients in CLIENT_LEVELS})


def measure_level(target: LoadTarget, clients: int, repeat: int, plan: Plan) -> None:
    from edge_llm import bench

    def one_level(attempt: int) -> dict[str, Any]:
        bar = bench.ProgressBar(f"{target.name} {clients:>2} clients")
        # Tagged: every request of the run has its own prompt (the same ones for ours and the peer).
        tag = f"c{clients}r{repeat}t{attempt}"
        level = bench.run_level(target.config, clients, plan.requests_for(clients), list(bench.DEFAULT_PROMPTS),
                                bar, tag=tag)
        return asyncio.run(level).to_dict()

    target.repeats[clients].append(measure_quietly(f"{target.name} {clients} clients", one_level, [target.pid], plan))


def run_levels(raw: RawLoop, targets: Sequence[LoadTarget], plan: Plan) -> None:
    """For each client count: raw, then every server, repeated, then raw once more (a paired design)."""
    for clients in CLIENT_LEVELS:
        for repeat in range(plan.level_repeats):
            raw.measure(clients)
            for target in targets:
                measure_level(target, clients, repeat, plan)
        raw.measure(clients)


def target_results(target: LoadTarget, plan: Plan, prefix: str) -> dict[str, Any]:
    """Every level (the table shows the repeat of median aggregate throughput) and the shared-prefix series."""
    levels = []
    for clients, repeats in target.repeats.items():
        middle = sorted(repeats, key=lambda r: r["aggregate_tokens_per_s"])[len(repeats) // 2]
        levels.append({**middle, "repeats": repeats})
    # Not repeated: a second try would find the prefix cached.
    prefix_plan = Plan(**{**plan.__dict__, "attempts": 1})
    shared = measure_quietly(f"{target.name} shared prefix",
                             lambda _: asyncio.run(shared_prefix(target.config, plan, prefix)), [target.pid],
                             prefix_plan)
    logger.info("%s: %s", target.name, ", ".join(
        f"{lv['concurrency']} clients {lv['aggregate_tokens_per_s']:.1f} tok/s" for lv in levels))
    return {"model": target.config.model, "levels": levels, "shared_prefix": shared}


async def shared_prefix(config: Any, plan: Plan, prefix: str) -> dict[str, Any]:
    from edge_llm import bench

    prefixed = bench.BenchConfig(base_url=config.base_url, max_tokens=plan.prefix_max_tokens, temperature=0.0,
                                 model=config.model, system_prompt=prefix)
    results = []
    async with bench.new_client(prefixed, 1) as client:
        for question in PREFIX_QUESTIONS[: plan.prefix_requests]:
            results.append(await bench.stream_chat(client, prefixed, question))
    ttfts = [r.ttft for r in results]
    later = [t for t in ttfts[1:] if t is not None]
    return {
        "requests": len(results),
        "errors": sum(not r.ok for r in results),
        "ttft_s": ttfts,
        "first_ttft_s": ttfts[0],
        "later_ttft_median_s": statistics.median(later) if later else None,
    }


# ---- targets ------------------------------------------------------------------------------------------


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


DISTURBED = 0.15  # a figure measured while other processes used more of the CPUs is not to be trusted


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


# ---- reports ------------------------------------------------------------------------------------------


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def _pct(value: float | None) -> str:
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
        lines.append(f"| {b['batch']} | {_fmt(b['decode_tokens_per_s'])} | {_fmt(b['decode_tokens_per_s_best'])} | "
                     f"{_fmt(b['prefill_s'], 1000, 0)} | {_fmt(b['end_to_end_tokens_per_s'])} | {_pct(b.get('neighbour_cpu'))} |")
    lines += ["", f"## (b, c) Servers under load ({NEW_TOKENS} max tokens, temperature 0, streamed)", "",
              "| server | clients | requests | errors | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms "
              "| stream tok/s | aggregate tok/s | raw same batch: decode / end-to-end tok/s | other CPU use |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("ours", "peer"):
        for lv in (results.get(name) or {}).get("levels", []):
            lines.append(
                f"| {name} | {lv['concurrency']} | {lv['requests']} | {lv['errors']} | "
                f"{_fmt(lv['ttft_median_s'], 1000, 0)} | {_fmt(lv['ttft_p95_s'], 1000, 0)} | "
                f"{_fmt(lv['itl_median_s'], 1000, 1)} | {_fmt(lv['itl_p95_s'], 1000, 1)} | "
                f"{_fmt(lv['stream_tokens_per_s_median'])} | {_fmt(lv['aggregate_tokens_per_s'])} | "
                f"{_fmt(raw_rate(raw, lv['concurrency']))} / {_fmt(raw_end_to_end(raw, lv['concurrency']))} | "
                f"{_pct(lv.get('neighbour_cpu'))} |")
    lines += ["", f"## (d) Shared prefix (~{raw['shared_prefix_tokens']}-token system prompt, sequential requests)",
              "", "| server | requests | first TTFT ms | later TTFT ms (median) | later / first | all TTFTs ms "
              "| other CPU use |", "|---|---:|---:|---:|---:|---|---:|"]
    for name in ("ours", "peer"):
        prefix = (results.get(name) or {}).get("shared_prefix")
        if prefix:
            all_ttfts = ", ".join(_fmt(t, 1000, 0) for t in prefix["ttft_s"])
            lines.append(f"| {name} | {prefix['requests']} | {_fmt(prefix['first_ttft_s'], 1000, 0)} | "
                         f"{_fmt(prefix['later_ttft_median_s'], 1000, 0)} | "
                         f"{_fmt(ratio(prefix['later_ttft_median_s'], prefix['first_ttft_s']), 1, 3)} | "
                         f"{all_ttfts} | {_pct(prefix.get('neighbour_cpu'))} |")
    lines += ["", "## Targets", "", "| check | ratio | target | pass | other CPU use (worst input) |",
              "|---|---:|---:|:---:|---:|"]
    for check in results["targets"]:
        mark = {True: "yes", False: "**no**", None: "–"}[check["pass"]]
        lines.append(f"| {check['check']} | {_fmt(check['ratio'], 1, 3)} | {check['target']} | {mark} | "
                     f"{_pct(check.get('inputs_neighbour_cpu'))} |")
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


def render_plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (tps, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    raw = results["raw"]["batches"]
    tps.plot([b["batch"] for b in raw], [b["decode_tokens_per_s"] for b in raw], "k--o",
             label="raw loop, decode steps only")
    tps.plot([b["batch"] for b in raw], [b["end_to_end_tokens_per_s"] for b in raw], "k-o",
             label="raw loop end-to-end (prefill + 64)")
    for name, style in (("ours", {"color": "C0", "marker": "o"}), ("peer", {"color": "C3", "marker": "s"})):
        levels = (results.get(name) or {}).get("levels", [])
        if not levels:
            continue
        clients = [lv["concurrency"] for lv in levels]
        tps.plot(clients, [lv["aggregate_tokens_per_s"] for lv in levels], **style, label=f"{name} aggregate")
        tps.plot(clients, [lv["stream_tokens_per_s_median"] or 0 for lv in levels], **style, alpha=0.5,
                 linestyle=":", label=f"{name} per stream (p50)")
        ttft.plot(clients, [(lv["ttft_median_s"] or 0) * 1000 for lv in levels], **style, label=f"{name} p50")
        ttft.plot(clients, [(lv["ttft_p95_s"] or 0) * 1000 for lv in levels], **style, alpha=0.5, linestyle=":",
                  label=f"{name} p95")
    tps.set(title="Throughput", xlabel="concurrent clients (raw: batch size)", ylabel="tokens/s",
            xticks=list(CLIENT_LEVELS))
    ttft.set(title="Time to first token", xlabel="concurrent clients", ylabel="ms", yscale="log",
             xticks=list(CLIENT_LEVELS))
    ttft.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    for axis in (tps, ttft):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    meta = results["meta"]
    fig.suptitle(f"{meta['model']} · {meta['threads']} threads · {meta['date']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def plot(json_path: Path, png_path: Path) -> None:
    """Renders here when matplotlib is importable, else with the peer venv's Python."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        python = ensure_peer_venv()
        subprocess.run([str(python), __file__, "--plot-only", str(json_path), str(png_path)], check=True)
        return
    render_plot(json.loads(json_path.read_text()), png_path)


# ---- main ---------------------------------------------------------------------------------------------------


def git_commit() -> str:
    """The commit measured, marked "+dirty" when src/ has uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    status = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=REPO, capture_output=True, text=True)
    return (head.stdout.strip() or "unknown") + ("+dirty" if status.stdout.strip() else "")


def metadata(model: Path, plan: Plan) -> dict[str, Any]:
    import llama_cpp

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "model": model.name,
        "threads": THREADS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_version": llama_cpp.__version__,
        "commit": git_commit(),
        "quick": plan.quick,
        "attempts": plan.attempts,
        "server_parallel": SERVER_PARALLEL,
        "new_tokens": NEW_TOKENS,
        "loadavg_before": os.getloadavg()[0],
    }


def default_model() -> Path:
    from edge_llm.models.fetch import default_model_path  # not at module level: see the module docstring

    return default_model_path()


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = Plan.make(args.quick, args.quiet_wait)
    model = (args.model or default_model()).resolve()
    RESULTS.mkdir(parents=True, exist_ok=True)
    prefix = shared_prefix_text()
    results: dict[str, Any] = {"meta": metadata(model, plan)}
    peer_python_path = None if args.skip_peer else ensure_peer_venv()
    logger.info("raw decode loop, our server%s, level by level", "" if args.skip_peer else " and llama_cpp.server")
    with raw_model(model, max(RAW_BATCHES)) as (_, ctx, vocab), ExitStack() as servers:
        raw = RawLoop(ctx, vocab, plan)
        extra_body = full_length_body(raw.end_tokens)
        commands = [("ours", ours_command, "/healthz")]
        if peer_python_path is not None:
            commands.append(("peer", peer_command, "/v1/models"))
        targets = []
        for name, command, health in commands:
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"
            process = servers.enter_context(server(name, command(model, port), base_url + health))
            wait_until_serving(base_url)
            targets.append(prepare_target(name, base_url, process.pid, plan, extra_body))
        run_levels(raw, targets, plan)
        for target in targets:
            results[target.name] = target_results(target, plan, prefix)
        results.setdefault("peer", None)
        results["raw"] = raw.results(len(tokenize(vocab, prefix)))
    results["meta"]["loadavg_after"] = os.getloadavg()[0]
    results["targets"] = evaluate_targets(results["raw"], results["ours"], results["peer"])
    return results


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    json_path = out_dir / "latest.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (out_dir / "latest.md").write_text(markdown_report(results), encoding="utf-8")
    plot(json_path, out_dir / "latest.png")
    logger.info("wrote %s, latest.md and latest.png", json_path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats (a few minutes)")
    parser.add_argument("--skip-peer", action="store_true", help="do not run llama_cpp.server")
    parser.add_argument("--quiet-wait", type=float, default=120.0, metavar="S",
                        help="before each phase, wait up to S seconds for other processes to leave the CPUs "
                        "idle (default: %(default)s; 0 measures at once)")
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF model (default: the one `edge-llm model fetch` downloads)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: %(default)s)")
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
        render_plot(json.loads(args.plot_only[0].read_text()), args.plot_only[1])
        return 0
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(results, args.out)
    sys.stdout.write(markdown_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
