"""Memory at the edge (issue 21) on real server processes and the real model: a quantized KV cache answers and
reports its memory; an unsupported KV combination is one start-up line; the persistent prefix cache gives
`cached_tokens` after a restart, is copied only while the engine is idle, survives a kill -9 in the middle of a save, and never loads a damaged,
truncated or foreign entry. The prefix-cache tests run on the small model (tests/helpers.py small_model): they
read what is saved and loaded, not what the answers say."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from edge_llm.engine.prefix_cache.store import encode_entry, read_header, read_state
from edge_llm.models.gguf_info import read_model_facts
from edge_llm.testing.server import MODEL, THREADS, RunningServer, run_server

from tests.fault_server import SAVE_STALL_ENV, run_fault_server
from tests.helpers import SMALL_MODEL_CHAT, metric, scrape, small_model, wait_for

# ~900 tokens of distinct numbered rules (as the benchmark's shared prefix), so a prompt is worth saving
RULES = "\n".join(
    f"Rule {i + 1}: when you work on module number {i * 7 + 3} of the {name} service, keep each change small, explain "
    f"the reason for it, and check case {i * 13 % 97} before you finish."
    for i, name in enumerate(["billing", "search", "upload", "mail", "auth", "reports"] * 4))
OTHER_RULES = RULES.replace("Rule", "Guideline").replace("module", "package")


def ask(server: RunningServer, system: str, question: str) -> dict:
    response = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "temperature": 0, "max_tokens": 4})
    assert response.status_code == 200, response.text
    return response.json()


def cached(answer: dict) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.kv"))


def test_a_q8_0_kv_cache_answers_and_reports_its_memory(tmp_path: Path) -> None:
    facts = read_model_facts(MODEL)
    with run_server(tmp_path, "--parallel", "2", "--ctx-size", "2048", "--cache-type-k", "q8_0",
                    "--cache-type-v", "q8_0") as server:
        answer = ask(server, "Be brief.", "What is 2 + 2?")
        assert answer["choices"][0]["message"]["content"]
        samples = scrape(server)
        log = server.log()
    per_cell = facts.kv_bytes_per_token("q8_0", "q8_0")
    assert per_cell * 2 == facts.kv_bytes_per_token("f16", "f16") * 34 // 32  # 34 bytes per 32 values
    assert metric(samples, "edge_llm_kv_cache_bytes_total") == 2048 * per_cell
    assert metric(samples, "edge_llm_kv_cache_bytes_used") == metric(samples, "edge_llm_kv_cells_used") * per_cell
    assert metric(samples, "edge_llm_kv_cells_total") == 2048
    assert '"cache_type_v": "q8_0"' in log and f'"kv_cache_bytes": {2048 * per_cell}' in log  # the banner


def test_a_quantized_v_without_flash_attention_is_one_startup_line() -> None:
    result = subprocess.run([sys.executable, "-m", "edge_llm", "serve", "--model", str(MODEL),
                             "--threads", str(THREADS), "--cache-type-v", "q4_0", "--flash-attn", "off"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "edge-llm: error: --cache-type-v q4_0 needs flash attention: drop --flash-attn off, or keep V in f16")


def test_the_prefix_cache_survives_a_restart_and_a_kill_during_a_save(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    flags = ("--parallel", "2", "--prefix-cache-dir", str(directory), *SMALL_MODEL_CHAT)
    with run_server(tmp_path, *flags, model=small_model()) as server:
        # A save is copied only when the engine is idle: not while another stream still runs
        busy_body = {"messages": [{"role": "user", "content": "Count from 1 to 1000."}], "max_tokens": 1000,
                     "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=busy_body, timeout=300) as busy:
            events = (line for line in busy.iter_lines() if line.startswith("data: "))
            next(events)
            first = ask(server, RULES, "Which rule is about mail?")
            assert first["usage"]["prompt_tokens"] > 800 and cached(first) == 0
            for _ in range(3):
                assert next(events) != "data: [DONE]"
            assert not list(directory.iterdir())  # the busy stream still runs: nothing copied, nothing written
        wait_for(lambda: len(entries(directory)) == 1, what="the entry to be written once the engine is idle")
    saved = read_header(entries(directory)[0])

    # Restarted, with every save stalled before its temporary file is complete: the saved prefix is loaded on first use...
    with run_fault_server(tmp_path, *flags, env={SAVE_STALL_ENV: "1"}, model=small_model()) as server:
        again = ask(server, RULES, "Which rule is about search?")
        assert cached(again) > 800
        assert metric(scrape(server), "edge_llm_prefix_disk_events_total", event="loaded") == 1
        # ...and a kill -9 while another prompt is being saved leaves no half entry
        ask(server, OTHER_RULES, "Which guideline is about mail?")
        wait_for(lambda: bool(list(directory.glob("*.tmp"))), what="a save in progress")
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(30)
    assert [read_header(path) for path in entries(directory)] == [saved]

    with run_server(tmp_path, *flags, model=small_model()) as server:
        after_kill = ask(server, RULES, "Which rule is about auth?")
        assert cached(after_kill) > 800
        assert server.process.poll() is None
    assert not list(directory.glob("*.tmp"))


def test_damaged_truncated_and_foreign_entries_are_never_loaded(tmp_path: Path) -> None:
    directory = tmp_path / "kv"
    flags = ("--parallel", "2", "--prefix-cache-dir", str(directory), *SMALL_MODEL_CHAT)
    with run_server(tmp_path, *flags, model=small_model()) as server:
        ask(server, RULES, "Which rule is about mail?")
        wait_for(lambda: len(entries(directory)) == 1, what="the entry to be written")
    (good,) = entries(directory)
    header = read_header(good)
    state = read_state(good, header)
    data = good.read_bytes()
    good.unlink()
    # the same prompt three times: a state byte flipped (caught by the checksum), cut short, of another model
    (directory / "flipped.kv").write_bytes(data[:-1000] + bytes([data[-1000] ^ 0xFF]) + data[-999:])
    (directory / "truncated.kv").write_bytes(data[: len(data) // 2])
    (directory / "foreign.kv").write_bytes(b"".join(encode_entry("f" * 64, header.tokens, state)))
    with run_server(tmp_path, *flags, model=small_model()) as server:
        answer = ask(server, RULES, "Which rule is about search?")
        assert answer["choices"][0]["message"]["content"] is not None
        assert cached(answer) == 0
        assert metric(scrape(server), "edge_llm_prefix_disk_events_total", event="rejected") == 2
        assert server.process.poll() is None
        log = server.log()
    assert "truncated.kv is truncated" in log
    assert "flipped.kv is checksum mismatch" in log
    assert "belong to another model file or KV settings" in log
    assert (directory / "foreign.kv").exists() and not (directory / "flipped.kv").exists()
