"""The benchmark parts that run alone (benchmarks/suite/structured*.py, real_client.py): workloads, paired ratios,
targets, the running-sequence gauge and the Markdown, on made-up figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.suite import real_client, structured
from benchmarks.suite import structured_report as sr

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def level(decode: float | None, aggregate: float, tokens: int = 200, requests: int = 1, cpu: float = 0.0) -> dict:
    return {"server_decode_tokens_per_s_median": decode, "stream_tokens_per_s_median": 1.0,
            "aggregate_tokens_per_s": aggregate, "completion_tokens": tokens * requests, "requests": requests,
            "errors": 0, "neighbour_cpu": cpu}


def results(peer: bool = True) -> dict:
    ours = {"plain": {"1": [level(40, 35), level(42, 36)], "4": [level(20, 80), level(20, 84)]},
            "json_schema": {"1": [level(38, 34), level(42, 36)], "4": [level(19, 72), level(20, 80)]}}
    runs = {"ours": ours}
    if peer:
        runs["llama-server"] = {"plain": {"1": [level(41, 36), level(41, 36)], "4": [level(20, 80), level(20, 80)]},
                                "json_schema": {"1": [level(40, 35), level(40, 35)], "4": [level(20, 80),
                                                                                          level(20, 80)]}}
    meta = {"date": "d", "model": "m.gguf", "threads": 2, "cpus": 2, "commit": "abc", "quick": False,
            "peer": "llama-server (x)" if peer else None,
            "peer_note": None if peer else "llama-server not found: ours only", "answer_tokens": 200}
    data = {"meta": meta, "runs": runs,
            "compile": [{"grammar": "g", "chars": 10, "convert_ms": 1.0, "compile_ms": 0.2, "clone_ms": 0.01}],
            "first_request": {"ours": {**structured.first_request_summary([0.2, 0.3], [0.1, 0.1]),
                                       "neighbour_cpu": 0.0}},
            "openings": {"ours": {"tool_call": '<tool_call>\n{"name"'}, "llama-server": {"tool_call": "```json\n|"}}}
    data["targets"] = sr.structured_targets(data)
    return data


def test_workload_bodies() -> None:
    assert structured.workload_body("plain") == {"ignore_eos": True}
    assert structured.workload_body("json_schema")["response_format"]["json_schema"]["schema"] is structured.TEAM_SCHEMA
    assert structured.workload_body("tool_call")["tool_choice"] == "required"
    assert structured.workload_body("plain_tools") == {"ignore_eos": True, "tools": [structured.TEAM_TOOL],
                                                       "tool_choice": "auto"}
    with pytest.raises(ValueError):
        structured.workload_body("nope")
    assert structured.fresh_schema("a") != structured.fresh_schema("b")


def test_ratios_pair_each_repeat_with_the_one_measured_next_to_it() -> None:
    rows = {(r["clients"], r["workload"]): r for r in sr.structured_rows(results())}
    one = rows[(1, "json_schema")]
    assert one["ours_vs_plain_decode"] == pytest.approx((38 / 40 + 42 / 42) / 2)
    assert one["ours_vs_peer_decode"] == pytest.approx((38 / 40 + 42 / 40) / 2)
    assert rows[(4, "json_schema")]["ours_vs_plain_aggregate"] == pytest.approx((72 / 80 + 80 / 84) / 2)
    assert rows[(1, "plain")]["ours_vs_plain_decode"] == 1.0


def test_a_tool_call_is_compared_with_its_own_prompt_answered_without_a_grammar() -> None:
    data = results()
    data["runs"]["ours"]["plain_tools"] = {"1": [level(36, 30), level(36, 30)]}
    data["runs"]["ours"]["tool_call"] = {"1": [level(35, 29), level(36, 30)]}
    rows = {(r["clients"], r["workload"]): r for r in sr.structured_rows(data)}
    assert rows[(1, "tool_call")]["plain"] == "plain_tools"
    assert rows[(1, "tool_call")]["ours_vs_plain_decode"] == pytest.approx((35 / 36 + 1) / 2)
    assert rows[(1, "plain_tools")]["ours_vs_plain_decode"] == pytest.approx((36 / 40 + 36 / 42) / 2)
    checks = {c["check"] for c in sr.structured_targets(data)}
    assert "ours 1 client tool_call decode tok/s / ours plain_tools" in checks


def test_decode_rate_falls_back_to_the_client_stream_timing() -> None:
    assert sr.decode_rate(level(None, 1.0)) == 1.0
    assert sr.paired([level(None, 1.0)], [level(2.0, 1.0)], sr.DECODE) == 0.5
    assert sr.paired([], [level(2.0, 1.0)], sr.DECODE) is None


def test_targets_of_issue_14() -> None:
    checks = {c["check"]: c for c in results()["targets"]}
    assert checks["ours 1 client json_schema decode tok/s / ours plain"]["pass"] is True  # 0.975
    assert checks["ours 4 clients json_schema aggregate tok/s / ours plain"]["pass"] is True  # 0.926
    assert checks["ours 1 client json_schema decode tok/s / llama-server json_schema"]["pass"] is True  # 1.0
    without_peer = {c["check"]: c for c in results(peer=False)["targets"]}
    assert without_peer["ours 1 client json_schema decode tok/s / llama-server json_schema"]["pass"] is None


def test_the_markdown_shows_every_row_and_says_when_the_peer_is_missing() -> None:
    text = sr.structured_markdown(results())
    assert text.count("| json_schema |") == 2 and "| 100.0 |" in text  # the fresh schema's extra ms
    assert r"""| tool_call | `<tool_call>\n{"name"` | `'''json\n\|` |""" in text  # one line each, escaped
    assert "llama-server not found" in sr.structured_markdown(results(peer=False))


def test_first_request_summary_pairs_fresh_and_repeated() -> None:
    summary = structured.first_request_summary([0.3, None, 0.5], [0.1, 0.1, 0.2])
    assert summary["extra_median_s"] == pytest.approx(0.25)
    assert summary["trials"] == 3


def test_the_running_gauge_is_read_from_either_server() -> None:
    ours = "# TYPE edge_llm_running_sequences gauge\nedge_llm_running_sequences 7.0\n"
    peer = ("# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 8\n")
    assert real_client.running_from_metrics(ours) == 7.0
    assert real_client.running_from_metrics(peer) == 8.0
    assert real_client.running_from_metrics("# nothing\n") is None
    assert real_client.running_summary([0, 3, 8, 5, 0]) == {"running_max": 8, "running_mean_while_busy": pytest.approx(16 / 3),
                                                            "running_samples": 5}


def test_the_real_client_markdown() -> None:
    row = {**level(20, 60, tokens=128, requests=16), "ttft_median_s": 0.5, "ttft_p95_s": 1.5, "running_max": 8.0,
           "running_mean_while_busy": 6.5, "cut_at_budget": 2}
    meta = {**results()["meta"], "clients": 8, "requests": 16, "prefix_tokens": 1003, "budget_s": 360.0}
    text = sr.real_client_markdown({"meta": meta, "ours": row, "llama-server": {**row, "aggregate_tokens_per_s": 30}})
    assert "| ours | 16 | 2 | 0 | 128 | 60.0 | 500 | 1500 |" in text and "aggregate tok/s 2.000" in text
    assert "a time budget of 360 s per server" in text
    failing = {**row, "errors": 16, "error_samples": ["Context size has been exceeded."]}
    text = sr.real_client_markdown({"meta": meta, "ours": row, "llama-server": failing,
                                    "llama-server -c 32768": {**row, "aggregate_tokens_per_s": 30}})
    assert "llama-server: 16 of 16 requests failed (Context size has been exceeded.)" in text
    assert "ours / llama-server -c 32768: aggregate tok/s 2.000" in text and "| llama-server -c 32768 | 16 |" in text


def test_the_entry_point_offers_the_parts_alone() -> None:
    from benchmarks.suite import parts

    result = subprocess.run([sys.executable, str(BENCHMARKS / "run_benchmarks.py"), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--only" in result.stdout and "--llama-server" in result.stdout
    for part in parts.PARTS:
        assert part in result.stdout
