"""The benchmark's paired ratios (benchmarks/suite/report.py): each repeat against its neighbours; and its
entry point's command line without a run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.suite import report as rb

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def raw_with_groups(*rates: float) -> dict:
    groups = [{"end_to_end_tokens_per_s": r, "decode_tokens_per_s": r * 1.2} for r in rates]
    return {"batches": [{"batch": 4, "end_to_end_tokens_per_s": 0.0, "decode_tokens_per_s": 0.0, "groups": groups}]}


def test_each_repeat_is_divided_by_the_mean_of_the_raw_runs_around_it() -> None:
    raw = raw_with_groups(50, 40, 50)
    level = {"aggregate_tokens_per_s": 0.0, "repeats": [{"aggregate_tokens_per_s": 45}, {"aggregate_tokens_per_s": 40}]}
    # 45 / 45 = 1.0 and 40 / 45 = 0.889: the median of two is their mean
    assert abs(rb.paired_ratio(level, raw, 4, "end_to_end_tokens_per_s") - (1.0 + 40 / 45) / 2) < 1e-9


def test_without_groups_around_every_repeat_it_falls_back_to_the_plain_ratio() -> None:
    raw = {"batches": [{"batch": 4, "end_to_end_tokens_per_s": 50.0, "groups": []}]}
    level = {"aggregate_tokens_per_s": 40.0, "repeats": [{"aggregate_tokens_per_s": 40.0}]}
    assert rb.paired_ratio(level, raw, 4, "end_to_end_tokens_per_s") == 0.8
    assert rb.paired_ratio(None, raw, 4, "end_to_end_tokens_per_s") is None


def test_servers_are_compared_repeat_by_repeat() -> None:
    mine = {"repeats": [{"a": 50.0}, {"a": 40.0}, {"a": 60.0}]}
    theirs = {"repeats": [{"a": 25.0}, {"a": 25.0}, {"a": 20.0}]}
    assert rb.paired_server_ratio(mine, theirs, "a") == 2.0  # median of 2.0, 1.6, 3.0
    assert rb.paired_server_ratio(mine, None, "a") is None


def test_record_only_checks_have_no_verdict() -> None:
    check = rb.target("x", 0.5, ">=", 0.95, [], record_only=True)
    assert check["pass"] is None and "for the record" in check["target"]
    assert rb.target("x", 0.5, ">=", 0.95, [])["pass"] is False


def test_the_committed_results_give_the_committed_report() -> None:
    results = json.loads((BENCHMARKS / "results" / "latest.json").read_text())
    assert rb.evaluate_targets(results["raw"], results["ours"], results["peer"]) == results["targets"]
    assert rb.markdown_report(results) == (BENCHMARKS / "results" / "latest.md").read_text()


def test_the_entry_point_keeps_its_command_line() -> None:
    result = subprocess.run([sys.executable, str(BENCHMARKS / "run_benchmarks.py"), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--quick", "--skip-peer", "--quiet-wait", "--model", "--out", "--plot-only"):
        assert flag in result.stdout


def test_the_plot_needs_neither_this_project_nor_llama_cpp() -> None:
    # --plot-only runs under the peer venv's Python, which has matplotlib but not edge_llm.
    check = ("import sys; sys.path.insert(0, sys.argv[1]); import suite.plan, suite.plot; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('edge_llm', 'llama_cpp', 'httpx')))")
    result = subprocess.run([sys.executable, "-c", check, str(BENCHMARKS)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
