"""The README's five-minute tour works as written: its Python snippets (the openai and ollama clients) run against a
real server, and its curl body streams OpenAI chunks. Only the address changes (the tests' server port)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from edge_llm.testing.server import RunningServer

README = Path(__file__).resolve().parents[2] / "README.md"
ADDRESS = "http://127.0.0.1:3000"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_the_python_snippets_stream_an_answer(server: RunningServer) -> None:
    snippets = blocks("python")
    assert [("OpenAI(" in code, "ollama" in code) for code in snippets] == [(True, False), (False, True)]
    for code in snippets:
        assert ADDRESS in code
        run = subprocess.run([sys.executable, "-c", code.replace(ADDRESS, server.url)], capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip(), code


def test_the_curl_request_streams_chunks(server: RunningServer) -> None:
    curl = next(code for code in blocks("sh") if code.startswith("curl"))
    words = shlex.split(curl.replace("\\\n", " "))
    url, body = words[words.index("-N") + 1], json.loads(words[words.index("-d") + 1])
    assert url.startswith(ADDRESS) and body["stream"] is True
    with httpx.stream("POST", url.replace(ADDRESS, server.url), json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
