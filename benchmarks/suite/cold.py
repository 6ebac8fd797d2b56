"""`--only cold` (issue 40): what a user meets before decode, ours and llama-server side by side, alternating.

Each round starts each server from nothing (the model file in the page cache) and measures, in this order:
- **ready**: from spawning the process to its readiness answering 200 (ours `/readyz`, llama-server `/health`),
  polled every 10 ms; then VmRSS and RssAnon (after load, before any request);
- **idle CPU**: the process's CPU ticks (all threads, utime + stime) over `IDLE_S` seconds of nothing;
- **cold prefill**: the first request, a prompt of ~1,000 tokens never seen before, 1 token answered: the prompt
  tokens over the client's time to the answer (a 16k-token prompt on servers started with `--ctx-size 32768`);
- **TTFT at 8 clients**: 8 requests at once, each with its own ~300-token prompt, 8 tokens streamed: the median
  time to the first content token.
- **model switch**: ours with `--models-dir` (both models of the catalogue), a request for the model not loaded →
  its first token; against llama-server started for that file → ready → the same request's first token.
Ratios are ours / llama-server's medians (ready, RSS, TTFT: lower is better; prefill rate: higher is better).
"""

from __future__ import annotations

import compileall
import concurrent.futures
import json
import logging
import random
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

import edge_llm
from edge_llm.testing.server import free_port, serve_command, stop

from .plan import REPO, RESULTS, THREADS, Plan

logger = logging.getLogger(__name__)

IDLE_S = 10.0
CLIENTS = 8
SHORT_CTX = 8192
LONG_CTX = 32768
_WORDS = ("river", "module", "packet", "signal", "ledger", "window", "copper", "harbor", "lantern", "meadow", "socket",
          "canvas", "thread", "falcon", "garden", "matrix", "pillow", "quartz", "saddle", "tunnel", "velvet", "walnut",
          "anchor", "bridge", "cobalt", "dagger", "engine", "fabric", "glacier", "hammer")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def unique_text(seed: int, words: int) -> str:
    """Plain sentences no server has seen (a prompt cached by an earlier round would not be cold)."""
    rng = random.Random(seed)
    sentences = []
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(f"Note {len(sentences) + 1}: the " + " ".join(rng.choice(_WORDS) for _ in range(9)) + ".")
    return " ".join(sentences)


def _readiness_status(url: str) -> int:
    try:
        with _OPENER.open(url, timeout=2) as response:
            return int(response.status)
    except Exception:  # noqa: BLE001 - not listening yet, or 503 while loading
        return 0


class Started:
    """One server process started by the benchmark, with its spawn-to-ready time."""

    def __init__(self, name: str, command: Sequence[str], port: int, ready_path: str, log_path: Path) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self._log = log_path.open("wb")
        began = time.perf_counter()
        self.process = subprocess.Popen(list(command), stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)
        while _readiness_status(self.url + ready_path) != 200:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.process.returncode}; see {log_path}")
            if time.perf_counter() - began > 300:
                raise RuntimeError(f"{name} not ready after 300 s; see {log_path}")
            time.sleep(0.01)
        self.ready_s = time.perf_counter() - began

    def memory_kib(self) -> dict[str, int]:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines())
        return {key: int(fields[key].split()[0]) for key in ("VmRSS", "RssAnon")}

    def cpu_ticks(self) -> int:
        total = 0
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total

    def close(self) -> None:
        stop(self.process)
        self._log.close()


def ours(flags: Sequence[str], model: Path | None, log_name: str) -> Started:
    port = free_port()
    command = serve_command(port, "--parallel", str(CLIENTS), "--log-level", "warning", *flags, model=model,
                            threads=THREADS)
    return Started("ours", command, port, "/readyz", RESULTS / log_name)


def llama_server(binary: Path, model: Path, ctx: int, log_name: str) -> Started:
    port = free_port()
    command = [str(binary), "--model", str(model), "--threads", str(THREADS), "--threads-batch", str(THREADS),
               "--parallel", str(CLIENTS), "--ctx-size", str(ctx), "--kv-unified", "--jinja",
               "--host", "127.0.0.1", "--port", str(port)]
    return Started("llama-server", command, port, "/health", RESULTS / log_name)


def answer(url: str, text: str, max_tokens: int, model: str | None = None) -> dict[str, float]:
    """One streamed chat request: seconds to its first content token, and its prompt tokens."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model is not None:
        body["model"] = model
    started = time.perf_counter()
    first = None
    prompt_tokens = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    first = first or time.perf_counter()  # an answer of no text: its end
    return {"ttft_s": first - started, "prompt_tokens": prompt_tokens}


def complete(url: str, prompt: str, model: str | None = None) -> float:
    """One completion of 1 token (a base model has no chat template): seconds to the answer."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if model is not None:
        body["model"] = model
    started = time.perf_counter()
    httpx.post(url + "/v1/completions", json=body, timeout=900).raise_for_status()
    return time.perf_counter() - started


def one_start(server: Started, seed: int, prompt_words: int, idle_s: float, clients: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"ready_s": server.ready_s, **server.memory_kib()}
    before = server.cpu_ticks()
    time.sleep(idle_s)  # the measurement window itself: nothing is sent
    row["idle_ticks"] = server.cpu_ticks() - before
    cold = answer(server.url, unique_text(seed, prompt_words), 1)
    row["cold_prompt_tokens"] = cold["prompt_tokens"]
    row["cold_prefill_s"] = cold["ttft_s"]
    row["cold_prefill_tok_s"] = cold["prompt_tokens"] / cold["ttft_s"]
    if clients:
        texts = [unique_text(seed * 100 + i, 220) for i in range(CLIENTS)]
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda t: answer(server.url, t, 8), texts))
        row["ttft_8_clients_median_s"] = statistics.median(r["ttft_s"] for r in results)
    return row


def alternate(rounds: int, start_ours: Callable[[int], Started], start_peer: Callable[[int], Started] | None,
              measure: Callable[[Started, int], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "llama-server": []}
    for r in range(rounds):
        for name, start in (("ours", start_ours), ("llama-server", start_peer)):
            if start is None:
                continue
            server = start(r)
            try:
                runs[name].append(measure(server, r))
            finally:
                server.close()
            logger.info("cold round %d %s: %s", r + 1, name, runs[name][-1])
    return runs


def model_switch(model: Path, other: Path, binary: Path | None, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Ours: both models in a --models-dir, the first request for `other` (not loaded) → its first token.
    llama-server: started for `other` → ready → the same request's first token."""
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "llama-server": []}
    with tempfile.TemporaryDirectory(prefix="edge-llm-switch-") as directory:
        for path in (model, other):
            (Path(directory) / path.name).symlink_to(path)
        for r in range(rounds):
            server = ours(["--models-dir", directory], None, "cold-switch-ours.log")
            try:
                switch_s = complete(server.url, unique_text(900 + r, 40), model=other.name.removesuffix(".gguf"))
                runs["ours"].append({"switch_s": switch_s})
            finally:
                server.close()
            if binary is not None:
                began = time.perf_counter()
                peer = llama_server(binary, other, SHORT_CTX, "cold-switch-llama-server.log")
                try:
                    complete(peer.url, unique_text(900 + r, 40))
                    runs["llama-server"].append({"switch_s": time.perf_counter() - began, "ready_s": peer.ready_s})
                finally:
                    peer.close()
    return runs


def compile_bytecode() -> None:
    """The package's bytecode, as `pip install` (and the Docker image) writes it: a checkout run with
    PYTHONDONTWRITEBYTECODE set (CI, this machine's sandbox) would compile each of its ~150 modules again at every
    start, 0.15-0.3 s of CPU on the ready path that no installed server pays (issue 40)."""
    compileall.compile_dir(Path(edge_llm.__file__).parent, quiet=1)


def run_cold(model: Path, plan: Plan, binary: Path | None, other_model: Path | None) -> dict[str, Any]:
    compile_bytecode()
    rounds = 2 if plan.quick else 3
    idle_s = IDLE_S / 2 if plan.quick else IDLE_S

    def peer(ctx: int, log: str) -> Callable[[int], Started] | None:
        return None if binary is None else (lambda r: llama_server(binary, model, ctx, log))

    short = alternate(rounds, lambda r: ours([], model, "cold-ours.log"), peer(SHORT_CTX, "cold-llama-server.log"),
                      lambda s, r: one_start(s, 10 + r, 700, idle_s, clients=True))
    long = alternate(rounds, lambda r: ours(["--ctx-size", str(LONG_CTX)], model, "cold-ours-32k.log"),
                     peer(LONG_CTX, "cold-llama-server-32k.log"),
                     lambda s, r: one_start(s, 50 + r, 10_800, 0.0, clients=False))
    results: dict[str, Any] = {"rounds": rounds, "idle_s": idle_s, "short": short, "long": long}
    if other_model is not None:
        results["switch"] = model_switch(model, other_model, binary, rounds)
    results["options"] = options_cost(model, rounds)
    return results


def options_cost(model: Path, rounds: int) -> dict[str, list[float]]:
    """Ours only: ready time with speculation off (default: on) and with a persistent prefix cache directory."""
    costs: dict[str, list[float]] = {"default": [], "speculative off": [], "prefix cache dir": []}
    with tempfile.TemporaryDirectory(prefix="edge-llm-cold-cache-") as cache:
        variants = {"default": [], "speculative off": ["--speculative", "off"],
                    "prefix cache dir": ["--prefix-cache-dir", cache]}
        for _ in range(rounds):
            for name, flags in variants.items():
                server = ours(flags, model, "cold-options.log")
                costs[name].append(server.ready_s)
                if name == "prefix cache dir":  # the next start finds a saved prefix
                    answer(server.url, unique_text(700, 400), 1)
                server.close()
    return costs


# ---- report ----------------------------------------------------------------------------------------------------------

TARGETS = {  # figure: (ratio ours / llama-server must be ≤ this, or ≥ when "min")
    "ready_s": (1.2, "max"), "VmRSS": (1.03, "max"), "ttft_8_clients_median_s": (1.0, "max"),
    "cold_prefill_tok_s": (1.0, "min"),
}
_LABELS = {"ready_s": "serve → ready (s)", "VmRSS": "RSS after load (MiB)", "RssAnon": "anonymous RSS (MiB)",
           "idle_ticks": "CPU ticks while idle", "cold_prompt_tokens": "cold prompt (tokens)",
           "cold_prefill_tok_s": "cold prefill (tokens/s)", "ttft_8_clients_median_s": "TTFT median, 8 clients (s)",
           "switch_s": "model switch → first token (s)"}


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if key in row]
    if not values:
        return None
    value = statistics.median(values)
    return value / 1024 if key in ("VmRSS", "RssAnon") else value


def _table(title: str, runs: dict[str, list[dict[str, Any]]], keys: Sequence[str]) -> list[str]:
    lines = [f"### {title}", "", "| figure | llama-server | ours | ratio | target |", "|---|---|---|---|---|"]
    for key in keys:
        ours_value, peer_value = _median(runs["ours"], key), _median(runs["llama-server"], key)
        if ours_value is None:
            continue
        ratio = ours_value / peer_value if peer_value else None
        target = ""
        if key in TARGETS and ratio is not None:
            bound, kind = TARGETS[key]
            met = ratio <= bound if kind == "max" else ratio >= bound
            target = f"{'≤' if kind == 'max' else '≥'} {bound} {'met' if met else '**not met**'}"
        peer_text = "—" if peer_value is None else f"{peer_value:,.2f}"
        lines.append(f"| {_LABELS.get(key, key)} | {peer_text} | {ours_value:,.2f} | "
                     f"{'—' if ratio is None else f'{ratio:.2f}'} | {target} |")
    return lines + [""]


def cold_markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = ["# Cold paths: start, first prefill, model switch, idle, footprint (`--only cold`)", "",
             f"{meta['date']}, commit {meta['commit']}, {meta['model']}, {meta['threads']} threads, "
             f"{meta['cpus']} CPUs, load average {meta['loadavg_before']:.2f} before and "
             f"{meta.get('loadavg_after', 0):.2f} after; {results['rounds']} rounds, medians; "
             f"{meta['peer'] or meta['peer_note']}.", ""]
    if meta.get("note"):
        lines += [f"Note: {meta['note']}.", ""]
    lines += _table(f"ctx {SHORT_CTX}, 8 slots (idle window {results['idle_s']:.0f} s)", results["short"],
                    ("ready_s", "VmRSS", "RssAnon", "idle_ticks", "cold_prompt_tokens", "cold_prefill_tok_s",
                     "ttft_8_clients_median_s"))
    lines += _table(f"ctx {LONG_CTX}: a 16k-token first prompt", results["long"],
                    ("ready_s", "cold_prompt_tokens", "cold_prefill_tok_s"))
    if "switch" in results:
        lines += _table("model switch: an unloaded model's first token (ours: --models-dir; llama-server: a start)",
                        results["switch"], ("switch_s",))
    options = results["options"]
    lines += ["### What the options cost on the cold path (ours, serve → ready, median s)", "",
              "| variant | ready (s) |", "|---|---|"]
    lines += [f"| {name} | {statistics.median(values):.2f} |" for name, values in options.items()]
    return "\n".join(lines) + "\n"
