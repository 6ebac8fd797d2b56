"""The deterministic-mode benchmark's request list, targets and Markdown (benchmarks/suite/determinism.py)."""

from __future__ import annotations

from benchmarks.suite import determinism as dm


def level(rate: float, greedy: list[str], seeded: list[str]) -> dict:
    return {"requests": 2 * (len(greedy) + len(seeded)), "answers": {"greedy": greedy, "seeded": seeded},
            "completion_tokens": 100, "seconds": 100 / rate, "aggregate_tok_s": rate, "neighbour_cpu": 0.01}


def test_the_same_list_on_both_servers_with_probes_cold_and_warm() -> None:
    chosen = dm.requests_for(40)
    assert chosen == dm.requests_for(40)
    probes = [item for item in chosen if item["probe"]]
    assert len(probes) == 20 and {p["probe"] for p in probes} == {"greedy", "seeded"}
    assert {p["body"]["cache_prompt"] for p in probes} == {True, False}
    for kind in ("greedy", "seeded"):  # one body per probe kind, but for the cache
        bodies = [{k: v for k, v in p["body"].items() if k != "cache_prompt"} for p in probes if p["probe"] == kind]
        assert all(body == bodies[0] for body in bodies)


def test_targets_count_distinct_answers_and_the_cost_per_level() -> None:
    runs = {dm.DEFAULT: {"1": level(40, ["a", "b"], ["c", "d"]), "4": level(80, ["a"], ["c"])},
            dm.DETERMINISTIC: {"1": level(36, ["a", "a"], ["c", "c"]), "4": level(60, ["a"], ["e"])}}
    results = {"meta": {"date": "today", "commit": "abc", "model": "m.gguf", "threads": 2}, "runs": runs}
    checks = {check["check"]: check for check in dm.determinism_targets(results)}
    distinct = checks["--deterministic: distinct answers per probe over 6 probes"]
    assert distinct["ratio"] == 1.5 and distinct["pass"] is False  # seeded gave "c" and "e"
    assert checks["--deterministic aggregate tok/s / default, 1 clients"]["ratio"] == 0.9
    assert checks["--deterministic aggregate tok/s / default, 4 clients"]["pass"] is False  # 0.75
    markdown = dm.determinism_markdown({**results, "targets": list(checks.values())})
    assert "| ours --deterministic | 1 | 8 | 1 of 2 | 1 of 2 | 36.0 | 0.90 |" in markdown
    assert "- ours default: greedy 2 distinct of 3, seeded 2 distinct of 3" in markdown
