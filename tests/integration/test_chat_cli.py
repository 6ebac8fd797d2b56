"""`edge-llm chat` against a real server: one-shot (-p, -p -), the interactive loop driven through
stdin (conversation kept, /system, /set, /reset, exit) and Ctrl+C stopping an answer, which the
server counts as a cancellation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from edge_llm.testing.server import RunningServer, free_port
from tests.helpers import CHAT_CLI_KEY, CHAT_FRONT_ENDS_FLAGS, scrape, total, wait_for
from tests.server_pool import ServerWith

KEY = CHAT_CLI_KEY


@pytest.fixture(scope="module")
def chat_server(server_with: ServerWith) -> RunningServer:
    return server_with(*CHAT_FRONT_ENDS_FLAGS)  # shared with the web chat's tests


def chat_command(server: RunningServer, *args: str) -> list[str]:
    return [sys.executable, "-m", "edge_llm", "chat", server.url, "--api-key", KEY, *args]


def run_chat(server: RunningServer, *args: str, stdin: str = "", env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(chat_command(server, *args), input=stdin, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def sent_prompts(server: RunningServer) -> list[Any]:
    """The `messages` of every chat request, from the server's access lines (--log-prompts)."""
    prompts = []
    for line in server.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("logger") == "edge_llm.access" and record.get("path") == "/v1/chat/completions":
            prompts.append(record.get("prompt"))
    return prompts


def wait_for_prompts(server: RunningServer, count: int) -> list[Any]:
    """The access line is written as the response ends, a moment after the client saw its end."""
    wait_for(lambda: len(sent_prompts(server)) >= count, 10, f"{count} access lines")
    return sent_prompts(server)


def cancellations(server: RunningServer) -> float:
    return total(scrape(server, {"Authorization": f"Bearer {KEY}"}), "edge_llm_cancellations_total")


def test_one_shot_prints_only_the_answer(chat_server: RunningServer) -> None:
    before = len(sent_prompts(chat_server))
    result = run_chat(chat_server, "-p", "What is 2 + 2? Reply with the number only.", "--temperature", "0",
                      "--max-tokens", "8")
    assert result.returncode == 0, result.stderr
    assert "4" in result.stdout
    assert result.stdout.endswith("\n")
    assert result.stderr == ""  # pipe-friendly: nothing but the answer

    result = run_chat(chat_server, "-p", "-", "--temperature", "0", "--max-tokens", "8",
                      "--system", "You reply with one word.",
                      stdin="What colour is a clear daytime sky? One word.\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    last = wait_for_prompts(chat_server, before + 2)[-1]
    assert last[0] == {"role": "system", "content": "You reply with one word."}
    assert last[1]["content"] == "What colour is a clear daytime sky? One word.\n"


def test_one_shot_errors_are_one_line_and_exit_1(chat_server: RunningServer) -> None:
    no_key = subprocess.run([sys.executable, "-m", "edge_llm", "chat", chat_server.url, "-p", "hi"],
                            capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if k != "EDGE_LLM_API_KEY"})
    assert no_key.returncode == 1
    assert no_key.stderr.strip() == ("edge-llm: error: the server needs an API key: pass --api-key KEY "
                                     "(or set EDGE_LLM_API_KEY)")
    unreachable = subprocess.run([sys.executable, "-m", "edge_llm", "chat", f"http://127.0.0.1:{free_port()}",
                                  "-p", "hi"], capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1
    assert "cannot reach" in unreachable.stderr and "edge-llm serve" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    with_env_key = run_chat(chat_server, "-p", "Say yes.", "--max-tokens", "4", "--api-key", "wrong")
    assert with_env_key.returncode == 1 and "refused the API key" in with_env_key.stderr


def test_interactive_keeps_the_conversation_and_obeys_commands(chat_server: RunningServer) -> None:
    before = len(sent_prompts(chat_server))
    lines = [
        "Remember the word zebra. Reply with OK only.",
        "/system You always answer in one short sentence.",
        "/set temperature 0",
        "/set max_tokens 24",
        "/set nonsense 3",
        "What word did I ask you to remember?",
        "/reset",
        "Say hello.",
        "exit",
        "This line is never sent.",
    ]
    result = run_chat(chat_server, "--max-tokens", "16", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    assert "(system prompt set: You always answer in one short sentence.)" in result.stderr
    assert "(temperature = 0.0)" in result.stderr and "(max_tokens = 24)" in result.stderr
    assert "unknown setting 'nonsense'" in result.stderr
    assert "(conversation cleared)" in result.stderr
    assert result.stderr.count("TTFT") == 3  # figures after each of the three answers
    prompts = wait_for_prompts(chat_server, before + 3)[before:]
    assert len(prompts) == 3
    assert [m["role"] for m in prompts[0]] == ["user"]
    assert [m["role"] for m in prompts[1]] == ["system", "user", "assistant", "user"]
    assert prompts[1][0]["content"] == "You always answer in one short sentence."
    assert prompts[1][1]["content"] == "Remember the word zebra. Reply with OK only."
    assert [m["role"] for m in prompts[2]] == ["system", "user"]  # /reset forgot the turns, not the system prompt
    assert prompts[2][1]["content"] == "Say hello."


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_stops_the_answer_on_the_server_without_leaving(chat_server: RunningServer) -> None:
    before = cancellations(chat_server)
    sent_before = len(sent_prompts(chat_server))
    # Started the way a background job of a script is: with SIGINT ignored, which the child inherits. The chat
    # must still stop on Ctrl+C (it restores the default handler).
    process = subprocess.Popen(chat_command(chat_server, "--temperature", "0", "--max-tokens", "1500"),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_ignore_sigint)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    received: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: received.extend(iter(lambda: process.stdout.read(1), "")), daemon=True),
               threading.Thread(target=lambda: errors.extend(iter(lambda: process.stderr.read(1), "")), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        process.stdin.write("Count from 1 to 1000, each number on its own line. Do not stop early.\n")
        process.stdin.flush()
        wait_for(lambda: len("".join(received)) > 30, 180, "the answer to start streaming")
        process.send_signal(signal.SIGINT)
        wait_for(lambda: cancellations(chat_server) > before, 15, "the server to count the cancellation")
        wait_for(lambda: "stopped" in "".join(errors), 10, "the chat to say it stopped")
        assert process.poll() is None  # still running, waiting for the next question
        stopped_at = len("".join(received))
        process.stdin.write("Reply with the word done.\n")
        process.stdin.flush()
        wait_for(lambda: "".join(errors).count("TTFT") >= 2, 180, "the next answer")
        assert len("".join(received)) > stopped_at
        process.stdin.write("exit\n")
        process.stdin.flush()
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # The stopped answer stays in the conversation: the next request carried it.
    last = wait_for_prompts(chat_server, sent_before + 2)[-1]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert last[1]["content"].startswith("1")
