"""The vLLM-named series routers read carry the same values as ours, with vLLM's names, labels and types."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from edge_llm.api.metrics import Metrics, ServedModel, ServerState
from edge_llm.engine.types import EngineStats


def families(stats: EngineStats, model: ServedModel) -> dict[str, object]:
    metrics = Metrics()
    metrics.watch(lambda: [(model, stats)], lambda: ServerState(True, True, False, 0))
    text = metrics.exposition()[0].decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_vllm_gauges_mirror_ours() -> None:
    stats = EngineStats(waiting=3, running=2, cached_sequences=1, kv_cells_used=512, kv_cells_total=2048)
    found = families(stats, ServedModel("qwen-test", prefix_caching=True))
    labels = {"model_name": "qwen-test", "engine": "0"}
    for vllm_name, ours, value in (("vllm:num_requests_running", "edge_llm_running_sequences", 2),
                                   ("vllm:num_requests_waiting", "edge_llm_queue_depth", 3),
                                   ("vllm:kv_cache_usage_perc", "edge_llm_kv_cache_usage_ratio", 0.25)):
        family = found[vllm_name]
        assert family.type == "gauge", vllm_name
        [sample] = family.samples
        assert sample.labels == labels and sample.value == value, sample
        assert found[ours].samples[0].value == value
    [info] = found["vllm:cache_config_info"].samples
    assert found["vllm:cache_config_info"].type == "gauge" and info.value == 1
    assert info.labels == {"model_name": "qwen-test", "block_size": "1", "num_gpu_blocks": "2048",
                           "enable_prefix_caching": "True", "engine": "0"}


def test_an_empty_cache_reads_as_zero_usage() -> None:
    stats = EngineStats(waiting=0, running=0, cached_sequences=0, kv_cells_used=0, kv_cells_total=0)
    found = families(stats, ServedModel("m", prefix_caching=False))
    assert found["vllm:kv_cache_usage_perc"].samples[0].value == 0
    assert found["vllm:cache_config_info"].samples[0].labels["enable_prefix_caching"] == "False"


def test_with_two_models_ours_are_the_sums_and_vllms_a_sample_each() -> None:
    coder = EngineStats(waiting=1, running=2, cached_sequences=1, kv_cells_used=100, kv_cells_total=1000,
                        preemptions=1, evictions={"cells": 2})
    small = EngineStats(waiting=0, running=1, cached_sequences=0, kv_cells_used=300, kv_cells_total=1000,
                        evictions={"cells": 1, "cache_slots": 4})
    metrics = Metrics()
    metrics.watch(lambda: [(ServedModel("coder", True), coder), (ServedModel("small", True), small)],
                  lambda: ServerState(True, True, False, 0))
    found = {f.name: f for f in text_string_to_metric_families(metrics.exposition()[0].decode())}
    assert found["edge_llm_running_sequences"].samples[0].value == 3
    assert found["edge_llm_kv_cache_usage_ratio"].samples[0].value == 0.2
    assert {s.labels["reason"]: s.value for s in found["edge_llm_prefix_cache_evictions"].samples
            if s.name.endswith("_total")} == {"cells": 3, "cache_slots": 4}
    assert {s.labels["model_name"]: s.value for s in found["vllm:num_requests_running"].samples} == {
        "coder": 2, "small": 1}
    # Same KV size, two models: two samples, not one duplicated (a scrape with duplicates is rejected).
    assert sorted(s.labels["model_name"] for s in found["vllm:cache_config_info"].samples) == ["coder", "small"]
