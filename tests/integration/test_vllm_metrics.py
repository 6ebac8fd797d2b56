"""The vLLM-named gauges on a live server carry our own gauges' values, scrape for scrape, under load."""

from __future__ import annotations

import threading

import httpx

from edge_llm.testing.server import MODEL_ID, RunningServer
from tests.helpers import Samples, chat_body, metric, scrape, wait_for

LABELS = {"model_name": MODEL_ID, "engine": "0"}
SAME = (("vllm:num_requests_running", "edge_llm_running_sequences"),
        ("vllm:num_requests_waiting", "edge_llm_queue_depth"),
        ("vllm:kv_cache_usage_perc", "edge_llm_kv_cache_usage_ratio"))


def assert_mirrored(samples: Samples) -> None:
    for vllm_name, ours in SAME:
        assert (vllm_name, tuple(sorted(LABELS.items()))) in samples, vllm_name
        assert metric(samples, vllm_name, **LABELS) == metric(samples, ours), (vllm_name, ours)
    config = [labels for (name, labels), value in samples.items() if name == "vllm:cache_config_info" and value == 1]
    assert len(config) == 1, config
    info = dict(config[0])
    assert int(info["block_size"]) * int(info["num_gpu_blocks"]) == metric(samples, "edge_llm_kv_cells_total") > 0
    assert info["enable_prefix_caching"] == "True" and info["engine"] == "0"


def test_vllm_named_gauges_mirror_ours_under_load(server: RunningServer) -> None:
    assert_mirrored(scrape(server))
    running: list[Samples] = []
    done = threading.Event()

    def stream() -> None:
        body = chat_body("Write the numbers from 1 to 200, separated by commas.", max_tokens=48, stream=True)
        try:
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as response:
                assert response.status_code == 200
                for _ in response.iter_bytes():
                    if done.is_set():
                        break
        finally:
            done.set()

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()

    def busy() -> bool:
        samples = scrape(server)
        assert_mirrored(samples)
        if metric(samples, "vllm:num_requests_running", **LABELS) >= 1:
            running.append(samples)
        return bool(running) or done.is_set()

    wait_for(busy, 300, "a scrape with a running request")
    done.set()
    for thread in threads:
        thread.join(300)
    assert running, "the requests ended before any scrape saw them running"
    assert metric(running[0], "vllm:kv_cache_usage_perc", **LABELS) > 0
