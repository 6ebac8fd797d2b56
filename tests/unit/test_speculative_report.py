"""The speculative-decoding benchmark's ratios, targets and Markdown (benchmarks/suite/speculative.py)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.suite import speculative as sp

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def level(decode: float, aggregate: float, texts: list[str], acceptance: float | None = None) -> dict:
    return {"decode_tok_s_median": decode, "aggregate_tok_s": aggregate, "texts": texts, "acceptance": acceptance,
            "neighbour_cpu": 0.01}


def results() -> dict:
    runs = {
        sp.OFF: {"code": {"1": level(40, 35, ["a", "b", "c"]), "4": level(30, 60, ["a"] * 4)},
                 "prose": {"1": level(40, 36, ["x"]), "4": level(30, 55, ["x"]), "8": level(20, 60, ["x"])}},
        sp.NGRAM: {"code": {"1": level(80, 70, ["a", "b", "d"], 0.8), "4": level(45, 90, ["a"] * 4, 0.7)},
                   "prose": {"1": level(39, 36, ["x"], 0.1), "4": level(30, 50, ["x"]), "8": level(20, 60, ["x"])}},
    }
    meta = {"date": "today", "model": "m.gguf", "threads": 2, "commit": "abc", "quick": True,
            "peer_note": "llama-server not run"}
    return {"meta": meta, "runs": runs}


def test_code_edit_prompts_carry_the_whole_file() -> None:
    code = sp.prompts("code")
    assert len(code) == 3 and all(sp.SOURCE in content and tokens == sp.CODE_TOKENS and fmt is None
                                  for content, tokens, fmt in code)
    assert 40 <= sp.SOURCE.count("\n") <= 50


def test_the_schema_workload_asks_the_json_tasks_under_a_strict_schema_each() -> None:
    schema = sp.prompts("schema")
    assert [content for content, _, _ in schema] == [content for content, _, _ in sp.prompts("json")]
    for _, _, fmt in schema:
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        (name, array), = fmt["json_schema"]["schema"]["properties"].items()
        item = array["items"]
        assert array["type"] == "array" and set(item["required"]) == set(item["properties"])


def test_targets_of_issue_17() -> None:
    checks = {c["check"]: c for c in sp.speculative_targets(results())}
    assert checks["ours ngram / off, code, 1 client, decode tok/s"]["pass"] is True  # 2.0
    assert checks["ours ngram / off, code, 4 clients, aggregate tok/s"]["ratio"] == 1.5
    assert checks["ours ngram / off, prose, 1 client, decode tok/s"]["pass"] is True  # 0.975
    assert checks["ours ngram / off, prose, 4 clients, aggregate tok/s"]["pass"] is False  # 0.91


def test_the_markdown_shows_rows_same_texts_and_the_missing_peer() -> None:
    text = sp.speculative_markdown(results())
    assert "| code | 1 | ours ngram | 80.0 | 70.0 | 2.00 / 2.00 | 80% | 2/3 |" in text
    assert "llama-server not run" in text
    assert "| ours ngram / off, prose, 4 clients, aggregate tok/s | 0.91 | >= 0.97 | **no** |" in text


def test_committed_results_are_what_the_report_makes_of_them() -> None:
    data = RESULTS / "speculative.json"
    if not data.exists():
        return  # not measured yet on this branch
    assert (RESULTS / "speculative.md").read_text(encoding="utf-8") == sp.speculative_markdown(
        json.loads(data.read_text(encoding="utf-8")))
