"""Prometheus metrics, in a registry of their own per app (never the process-global one).

Counters and histograms are fed by the HTTP middleware and by the engine thread (through
`edge_llm.api.telemetry`); gauges are read from the engine when /metrics is scraped.
"""

from __future__ import annotations

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
)
CANCEL_PHASES = ("queued", "prefill", "decode")
FINISH_REASONS = ("stop", "length", "timeout", "cancelled", "error")

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(frozen=True)
class ServerState:
    """What the scrape-time collector reads besides the engine statistics."""

    alive: bool
    ready: bool
    draining: bool
    in_flight: int


class Metrics:
    def __init__(self) -> None:
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
        self.generated_tokens = Counter(
            "edge_llm_generated_tokens", "Tokens generated.", registry=r,
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
        self.idle_disconnects = Counter(
            "edge_llm_stream_idle_disconnects", "Connections closed because the client stopped reading.",
            registry=r,
        )
        for reason in REJECTION_REASONS:
            self.rejections.labels(reason)
        for phase in CANCEL_PHASES:
            self.cancellations.labels(phase)
        for reason in FINISH_REASONS:
            self.finished.labels(reason)

    def watch(self, engine_stats: Callable[[], EngineStats], server_state: Callable[[], ServerState]) -> None:
        self.registry.register(_LiveCollector(engine_stats, server_state))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _LiveCollector(Collector):
    """Gauges (and the engine's own counters) read at scrape time, so the engine thread pays nothing for them."""

    def __init__(self, engine_stats: Callable[[], EngineStats], server_state: Callable[[], ServerState]) -> None:
        self._engine_stats = engine_stats
        self._server_state = server_state

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # dynamic: never checked for name clashes at registration

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._engine_stats()
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
        usage = stats.kv_cells_used / stats.kv_cells_total if stats.kv_cells_total > 0 else 0.0
        yield gauge("edge_llm_kv_cache_usage_ratio", "Used share of the KV cache (0..1).", usage)
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
                                         "loaded into the KV cache, rejected (damaged, truncated or refused) and "
                                         "evicted (disk budget, covered by a longer entry).", labels=["event"])
            for event in ("saved", "loaded", "rejected", "evicted"):
                events.add_metric([event], disk[event])
            yield events
        yield CounterMetricFamily("edge_llm_preemptions", "Running sequences put back in the queue to free KV "
                                  "cells (they resume by recomputing).", value=stats.preemptions)
        evictions = CounterMetricFamily("edge_llm_prefix_cache_evictions", "Prefix-cache entries dropped, by reason.",
                                        labels=["reason"])
        for reason, count in stats.evictions.items():
            evictions.add_metric([reason], count)
        yield evictions
        yield gauge("edge_llm_http_requests_in_flight", "HTTP requests being served (health and metrics excluded).",
                    state.in_flight)
        yield gauge("edge_llm_engine_alive", "1 while the engine thread runs.", int(state.alive))
        yield gauge("edge_llm_ready", "1 while /readyz answers 200.", int(state.ready))
        yield gauge("edge_llm_draining", "1 while shutting down.", int(state.draining))
