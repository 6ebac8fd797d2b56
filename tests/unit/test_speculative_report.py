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
    for name in ("speculative", "speculative_repeats"):  # the full run, and a run of paired repeats
        data = RESULTS / f"{name}.json"
        if data.exists():
            assert (RESULTS / f"{name}.md").read_text(encoding="utf-8") == sp.speculative_markdown(
                json.loads(data.read_text(encoding="utf-8")))


def test_rounds_alternate_which_of_ours_goes_first_and_the_peer_goes_last() -> None:
    names = [sp.OFF, sp.NGRAM, sp.PEER]
    assert sp.paired_order(names, 0, 3) == [sp.OFF, sp.NGRAM, sp.PEER]
    assert sp.paired_order(names, 1, 3) == [sp.NGRAM, sp.OFF, sp.PEER]


def test_each_task_has_each_of_ours_first_in_turn_over_repeats() -> None:
    for tasks in (3, 8):  # an odd and an even number of rounds a repeat
        firsts: dict[int, list[str]] = {}
        for round_index in range(2 * tasks):
            firsts.setdefault(round_index % tasks, []).append(sp.paired_order([sp.OFF, sp.NGRAM], round_index,
                                                                              tasks)[0])
        assert all(sorted(order) == sorted([sp.OFF, sp.NGRAM]) for order in firsts.values()), (tasks, firsts)


def test_one_client_levels_go_through_every_task_and_others_by_rounds() -> None:
    assert sp.rounds_for("prose", 1, rounds=2, repeats=3) == 3 * len(sp.PROSE_TASKS)
    assert sp.rounds_for("code", 1, rounds=2, repeats=1) == 3
    assert sp.rounds_for("prose", 8, rounds=2, repeats=3) == 6
    assert sp.rounds_for("prose", 1, rounds=1, repeats=1, quick=True) == 3


def test_the_ratio_is_the_median_of_the_ratios_round_by_round() -> None:
    def measured(*rates: float) -> dict:
        return sp.merge_rounds([{**level(rate, rate * 2, [f"t{rate}"], 0.5), "decode_tok_s": [rate], "drafted": 10,
                                 "clients": 1, "requests": 1, "tokens": [100]} for rate in rates])

    # Paired: the machine was slow in the second round for both; the unpaired medians would give 19/20 = 0.95.
    runs = {sp.OFF: {"json": {"1": measured(20, 10, 22)}}, sp.NGRAM: {"json": {"1": measured(19, 11, 30)}}}
    assert sp.round_ratios(runs, sp.NGRAM, "json", 1, "decode_tok_s_median") == [0.95, 1.1, 30 / 22]
    assert sp.ratio(runs, sp.NGRAM, "json", 1, "decode_tok_s_median") == 1.1
    merged = runs[sp.NGRAM]["json"]["1"]
    assert merged["decode_tok_s_median"] == 19 and merged["acceptance"] == 0.5 and merged["drafted"] == 30
    assert merged["requests"] == 3 and merged["texts"] == ["t19", "t11", "t30"]
    check, = [c for c in sp.speculative_targets({"runs": runs}) if c["check"].startswith("ours ngram / off, json, 1")]
    assert check["ratio"] == 1.1 and check["pass"] is True and len(check["round_ratios"]) == 3
    text = sp.speculative_markdown({"meta": {"date": "d", "model": "m", "threads": 2, "commit": "c", "repeats": 3},
                                    "runs": runs})
    assert "each task is a round (3 times)" in text and "| 3 | 0.95 – 1.36 |" in text
