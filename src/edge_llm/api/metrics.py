"""Prometheus metrics, in a registry of their own per app (never the process-global one).

Counters and histograms are fed by the HTTP middleware and by the engine thread (through
`edge_llm.api.telemetry`); gauges are read from the engines when /metrics is scraped. The unlabelled engine
series are the server's totals over every loaded model; the `edge_llm_model_*` series carry a `model` label.

Beside our own names, the gauges routers and autoscalers read are also exported under vLLM's names, with
vLLM's labels (`model_name`, `engine`), a sample per loaded model, so the Gateway API Inference Extension's
endpoint picker, llm-d, the vLLM production-stack router and KEDA recipes work without custom configuration
(docs/deployment.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge_llm.engine.types import EngineStats

# Why a request was refused before (or instead of) generating.
REJECTION_REASONS = (
    "auth",
    "host_not_allowed",
    "origin_not_allowed",
    "body_too_large",
    "headers_too_large",
    "context_too_long",
    "queue_full",
    "shutting_down",
    "engine_unavailable",
    "model_memory_busy",
)
CONNECTION_CLOSE_REASONS = ("head_timeout", "body_timeout", "over_capacity")
CANCEL_PHASES = ("queued", "prefill", "decode")
FINISH_REASONS = ("stop", "length", "timeout", "cancelled", "error")

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_LOAD_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class ServedModel:
    """What the vLLM-named series are labelled with."""

    name: str  # vLLM's `model_name` label: the served model name
    prefix_caching: bool


# vLLM's one engine core is index 0; this server has one engine per process.
_VLLM_ENGINE = "0"
# vLLM counts the KV cache in blocks; ours is counted in cells, one token each.
_VLLM_BLOCK_SIZE = 1


@dataclass(frozen=True)
class ServerState:
    """What the scrape-time collector reads besides the engine statistics."""

    alive: bool
    ready: bool
    draining: bool
    in_flight: int


class Metrics:
    def __init__(self) -> None:
        # llama-server's Process-Start-Time-Unix header on /metrics: when the server started, in whole seconds.
        self.started_unix = int(time.time())
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            "edge_llm_http_requests", "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"], registry=r,
        )
        self.http_duration = Histogram(
            "edge_llm_http_request_duration_seconds", "Time from request to the end of its response.",
            ["route"], buckets=_DURATION_BUCKETS, registry=r,
        )
        self.rejections = Counter(
            "edge_llm_rejections", "Requests refused, by reason.", ["reason"], registry=r,
        )
        self.cancellations = Counter(
            "edge_llm_cancellations", "Generations cancelled because the client went away, by phase.",
            ["phase"], registry=r,
        )
        self.finished = Counter(
            "edge_llm_generations_finished", "Generations ended, by finish reason.", ["reason"], registry=r,
        )
        self.prompt_tokens = Counter(
            "edge_llm_prompt_tokens", "Prompt tokens of admitted requests (cached ones included).", registry=r,
        )
        self.cached_prompt_tokens = Counter(
            "edge_llm_cached_prompt_tokens", "Prompt tokens served from the prefix cache.", registry=r,
        )
        self.moved_prompt_tokens = Counter(
            "edge_llm_moved_prompt_tokens", "Cached prompt tokens whose KV was moved to new positions first "
            "(--cache-reuse: the rest of a file after an edit).", registry=r,
        )
        self.generated_tokens = Counter(
            "edge_llm_generated_tokens", "Tokens generated.", registry=r,
        )
        self.model_load = Histogram(
            "edge_llm_model_load_duration_seconds", "From the start of a model's load to its engine taking requests "
            "(at start-up, or on a request's demand with --models-dir).",
            ["model"], buckets=_LOAD_BUCKETS, registry=r,
        )
        self.ttft = Histogram(
            "edge_llm_time_to_first_token_seconds", "From submission to the engine to the first sampled token.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.inter_token = Histogram(
            "edge_llm_inter_token_latency_seconds", "Between consecutive tokens of one sequence.",
            buckets=_TOKEN_GAP_BUCKETS, registry=r,
        )
        self.queue_wait = Histogram(
            "edge_llm_queue_wait_seconds", "From submission until the request got a sequence.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.model_generated_tokens = Counter(
            "edge_llm_model_generated_tokens", "Tokens generated, by model.", ["model"], registry=r,
        )
        self.model_finished = Counter(
            "edge_llm_model_generations_finished", "Generations ended, by model and finish reason.",
            ["model", "reason"], registry=r,
        )
        self.idle_disconnects = Counter(
            "edge_llm_stream_idle_disconnects", "Connections closed because the client stopped reading.",
            registry=r,
        )
        self.connections_closed = Counter(
            "edge_llm_connections_closed", "Connections the server closed before a response, by reason: "
            "head_timeout, body_timeout, over_capacity (--head-timeout, --body-timeout, --max-connections).",
            ["reason"], registry=r,
        )
        for reason in CONNECTION_CLOSE_REASONS:
            self.connections_closed.labels(reason)
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for phase in CANCEL_PHASES:
            self.cancellations.labels(phase)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)

    def watch_models(self, models: Callable[[], list[ModelSample]]) -> None:
        self.registry.register(_ModelCollector(models))

    def watch(self, engines: Callable[[], list[tuple[ServedModel, EngineStats]]],
              server_state: Callable[[], ServerState]) -> None:
        """`engines`: each loaded model's engine snapshot; our unlabelled series are their sum and the vLLM-named
        ones a sample per model, from the same snapshots, so the two agree in every scrape."""
        self.registry.register(_LiveCollector(engines, server_state))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class ModelSample:
    """One served model, as the scrape-time collector reads it."""

    name: str
    state: str  # loaded, loading, unloaded, unloading
    memory_estimate_bytes: int
    requests_in_flight: int
    loads: int
    unloads: dict[str, int]  # by reason
    stats: EngineStats | None  # None while not loaded


MODEL_STATES = ("loaded", "loading", "unloaded", "unloading")


class _ModelCollector(Collector):
    def __init__(self, models: Callable[[], list[ModelSample]]) -> None:
        self._models = models

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        samples = self._models()
        state = GaugeMetricFamily("edge_llm_model_state", "1 for the state each model is in.",
                                  labels=["model", "state"])
        memory = GaugeMetricFamily("edge_llm_model_memory_estimate_bytes",
                                   "A model's memory estimate (weights, KV cache, buffers): what it takes of the "
                                   "budget while loaded.", labels=["model"])
        in_flight = GaugeMetricFamily("edge_llm_model_requests_in_flight", "Requests a model is serving.",
                                      labels=["model"])
        loads = CounterMetricFamily("edge_llm_model_loads", "Model loads.", labels=["model"])
        unloads = CounterMetricFamily("edge_llm_model_unloads", "Model unloads, by reason (idle, keep_alive, "
                                      "evicted, request).", labels=["model", "reason"])
        running = GaugeMetricFamily("edge_llm_model_running_sequences", "Sequences being prefilled or decoded.",
                                    labels=["model"])
        waiting = GaugeMetricFamily("edge_llm_model_queue_depth", "Requests waiting for a sequence.", labels=["model"])
        kv_used = GaugeMetricFamily("edge_llm_model_kv_cells_used", "KV-cache cells in use.", labels=["model"])
        for sample in samples:
            for name in MODEL_STATES:
                state.add_metric([sample.name, name], int(sample.state == name))
            memory.add_metric([sample.name], sample.memory_estimate_bytes)
            in_flight.add_metric([sample.name], sample.requests_in_flight)
            loads.add_metric([sample.name], sample.loads)
            for reason, count in sample.unloads.items():
                unloads.add_metric([sample.name, reason], count)
            stats = sample.stats or EngineStats(0, 0, 0, 0, 0)
            running.add_metric([sample.name], stats.running)
            waiting.add_metric([sample.name], stats.waiting)
            kv_used.add_metric([sample.name], stats.kv_cells_used)
        yield from (state, memory, in_flight, loads, unloads, running, waiting, kv_used)


class _LiveCollector(Collector):
    """Gauges (and the engine's own counters) read at scrape time, so the engine thread pays nothing for them."""

    def __init__(self, engines: Callable[[], list[tuple[ServedModel, EngineStats]]],
                 server_state: Callable[[], ServerState]) -> None:
        self._engines = engines
        self._server_state = server_state

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # dynamic: never checked for name clashes at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        engines = self._engines()
        stats = EngineStats.total([snapshot for _, snapshot in engines])
        state = self._server_state()

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, value=value)

        yield gauge("edge_llm_queue_depth", "Requests waiting for a sequence.", stats.waiting)
        yield gauge("edge_llm_running_sequences", "Sequences being prefilled or decoded.", stats.running)
        yield gauge("edge_llm_cached_sequences", "Finished sequences kept for prefix reuse.", stats.cached_sequences)
        yield gauge("edge_llm_kv_cells_used",
                    "KV-cache cells held by running and cached sequences (a shared prefix counts once).",
                    stats.kv_cells_used)
        yield gauge("edge_llm_kv_cells_total", "KV-cache size in cells (tokens).", stats.kv_cells_total)
        yield gauge("edge_llm_kv_cache_usage_ratio", "Used share of the KV cache (0..1).", kv_cache_usage(stats))
        if stats.kv_bytes_per_cell:
            yield gauge("edge_llm_kv_cache_bytes_used", "Bytes of the KV cells in use (cells used x bytes per cell in "
                        "the cache's K and V types).", stats.kv_cells_used * stats.kv_bytes_per_cell)
            yield gauge("edge_llm_kv_cache_bytes_total", "Bytes of the KV cache (cells x bytes per cell in the "
                        "--cache-type-k/-v types).", stats.kv_cells_total * stats.kv_bytes_per_cell)
        disk = stats.disk_cache
        if disk is not None:
            yield gauge("edge_llm_prefix_disk_entries", "Entries of the persistent prefix cache on disk.",
                        disk["entries"])
            yield gauge("edge_llm_prefix_disk_bytes", "Bytes of the persistent prefix cache's entries on disk.",
                        disk["bytes"])
            events = CounterMetricFamily("edge_llm_prefix_disk_events", "Persistent prefix cache: entries saved, "
                                         "loaded into the KV cache, rejected (damaged, truncated or refused), "
                                         "evicted (disk budget, covered by a longer entry) and evicted_before_save "
                                         "(left memory before the engine was idle to copy it).", labels=["event"])
            for event in ("saved", "loaded", "rejected", "evicted", "evicted_before_save"):
                events.add_metric([event], disk[event])
            yield events
        yield CounterMetricFamily("edge_llm_watchdog_stalls", "Decode steps and tokenizer-thread jobs that ran past "
                                  "--watchdog-seconds.", value=stats.watchdog_stalls)
        yield gauge("edge_llm_stalled_threads", "Engine or tokenizer threads on a job past --watchdog-seconds now "
                    "(/readyz is 503 \"degraded\" meanwhile).", stats.stalled_threads)
        yield CounterMetricFamily("edge_llm_preemptions", "Running sequences put back in the queue to free KV "
                                  "cells (they resume by recomputing).", value=stats.preemptions)
        yield CounterMetricFamily("edge_llm_aborted_steps", "Decode steps stopped part-way because every request "
                                  "in them was cancelled (an editor's stale completion).", value=stats.aborted_steps)
        evictions = CounterMetricFamily("edge_llm_prefix_cache_evictions", "Prefix-cache entries dropped, by reason.",
                                        labels=["reason"])
        for reason, count in stats.evictions.items():
            evictions.add_metric([reason], count)
        yield evictions
        yield CounterMetricFamily("edge_llm_speculative_drafted_tokens", "Draft tokens verified (speculative "
                                  "decoding).", value=stats.drafted_tokens)
        yield CounterMetricFamily("edge_llm_speculative_accepted_tokens", "Draft tokens accepted.",
                                  value=stats.accepted_tokens)
        drafted = CounterMetricFamily("edge_llm_speculative_drafted_by_position",
                                      "Draft tokens verified at each position of their draft (1 = first).",
                                      labels=["position"])
        accepted = CounterMetricFamily("edge_llm_speculative_accepted_by_position",
                                       "Draft tokens accepted at each position of their draft (1 = first).",
                                       labels=["position"])
        for position, (n_drafted, n_accepted) in enumerate(zip(stats.drafted_by_position,
                                                                stats.accepted_by_position), start=1):
            drafted.add_metric([str(position)], n_drafted)
            accepted.add_metric([str(position)], n_accepted)
        yield drafted
        yield accepted
        yield gauge("edge_llm_http_requests_in_flight", "HTTP requests being served (health and metrics excluded).",
                    state.in_flight)
        yield gauge("edge_llm_engine_alive", "1 while the engine thread runs.", int(state.alive))
        yield gauge("edge_llm_ready", "1 while /readyz answers 200.", int(state.ready))
        yield gauge("edge_llm_draining", "1 while shutting down.", int(state.draining))
        yield from _vllm_gauges(engines)  # from the same snapshots: equal to ours in every scrape


def _vllm_gauges(models: list[tuple[ServedModel, EngineStats]]) -> Iterator[GaugeMetricFamily]:
    """Our gauges under vLLM's names and labels (vllm/v1/metrics/loggers.py), a sample per loaded model.
    `vllm:cache_config_info` also carries `model_name` (vLLM's has none: it serves one model), so that two models
    with the same KV size are two samples, not a duplicate."""
    labels = ["model_name", "engine"]
    running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches "
                                "(= edge_llm_running_sequences).", labels=labels)
    waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Number of requests waiting to be processed "
                                "(= edge_llm_queue_depth).", labels=labels)
    usage = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage "
                              "(= edge_llm_kv_cache_usage_ratio).", labels=labels)
    # vLLM's info metric: a gauge always 1 whose labels carry the cache configuration. Routers read
    # block_size × num_gpu_blocks as the KV capacity in tokens.
    config = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig "
                               "(one block is one KV cell: num_gpu_blocks = edge_llm_kv_cells_total).",
                               labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"])
    for model, stats in models:
        values = [model.name, _VLLM_ENGINE]
        running.add_metric(values, stats.running)
        waiting.add_metric(values, stats.waiting)
        usage.add_metric(values, kv_cache_usage(stats))
        config.add_metric([model.name, str(_VLLM_BLOCK_SIZE), str(stats.kv_cells_total), str(model.prefix_caching),
                           _VLLM_ENGINE], 1)
    yield from (running, waiting, usage, config)


def kv_cache_usage(stats: EngineStats) -> float:
    return stats.kv_cells_used / stats.kv_cells_total if stats.kv_cells_total > 0 else 0.0
