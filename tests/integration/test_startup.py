"""`edge-llm serve` start-up as a person meets it: the default model found from any directory, the
banner, and one clear line (exit code 1) for a taken port, a missing model (naming where it looked) and
a context that does not fit in memory, before any model is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.testing.server import MODEL, THREADS, RunningServer, environment, free_port, require_model, run_server
from tests.helpers import wait_for
from tests.server_pool import ServerWith

DEFAULT_ID = DEFAULT_MODEL.filename.removesuffix(".gguf")
# Nothing from the developer's environment may choose the model for these tests.
NO_MODEL_ENV: dict[str, str | None] = {"EDGE_LLM_MODEL": None, "EDGE_LLM_MODELS_DIR": None, "EDGE_LLM_CONFIG": None}


def serve(*flags: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "edge_llm", "serve", "--model", str(MODEL),
                             "--threads", str(THREADS), *flags], capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


def serve_without_model_flag(cwd: Path, env: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_llm", "serve", "--port", str(free_port())], cwd=cwd,
                          env=environment({**NO_MODEL_ENV, **env}), capture_output=True, text=True, timeout=60)


def test_the_default_model_is_found_from_any_directory(tmp_path: Path) -> None:
    data_home = tmp_path / "data"
    (data_home / "edge-llm" / "models").mkdir(parents=True)
    (data_home / "edge-llm" / "models" / DEFAULT_MODEL.filename).symlink_to(require_model())
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    with run_server(tmp_path, "--log-format", "text", "--ctx-size", "1024", "--parallel", "1", "--cache-slots", "0",
                    model=None, cwd=elsewhere, env={**NO_MODEL_ENV, "XDG_DATA_HOME": str(data_home)}) as server:
        assert f"serving {DEFAULT_ID} on {server.url}; loading the model" in server.log()
        assert [card["id"] for card in httpx.get(server.url + "/v1/models").json()["data"]] == [DEFAULT_ID]


@pytest.fixture(scope="module")
def text_log_server(server_with: ServerWith) -> RunningServer:
    """A server logging in text, for its banner; nothing in this module asks it for more than /metrics."""
    return server_with("--log-format", "text", "--ctx-size", "2048", "--parallel", "2", "--cache-slots", "0")


def test_banner_then_a_second_server_on_the_same_port_is_refused(text_log_server: RunningServer) -> None:
    server = text_log_server
    log = server.log()
    port = server.url.rsplit(":", 1)[1]
    assert f"serving {MODEL.name.removesuffix('.gguf')} on {server.url}; loading the model" in log
    assert "(Q4_K_M, qwen2" in log
    assert "context     2,048 tokens shared by up to 2 parallel sequences (trained on 32,768)" in log
    assert f"threads     {THREADS} (prompt {THREADS})" in log  # the test servers' --threads
    assert "memory      ~" in log and "KV cache 24.0 MiB" in log  # 24 layers × 2048 × 128 × 2 × 2 bytes
    assert f"web chat    {server.url}/" in log
    assert f"try it      curl -N {server.url}/v1/chat/completions" in log

    result, _ = serve("--port", port)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"edge-llm: error: port {port} is already in use on 127.0.0.1 (another edge-llm serve?). "
        f"Stop that process, or pick a free port with --port, e.g. --port {int(port) + 1}")
    assert "model loaded" not in result.stderr  # refused before loading anything


def test_a_context_too_big_for_memory_is_refused_before_loading() -> None:
    result, _ = serve("--ctx-size", "4000000", "--port", str(free_port()))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("edge-llm: error: not enough memory for a context of 4,000,000 tokens")
    assert "Lower --ctx-size (about 32,768 fits)" in last
    assert "model loaded" not in result.stderr


@pytest.mark.parametrize("override_dir", [False, True])
def test_a_missing_default_model_names_where_it_looked(tmp_path: Path, override_dir: bool) -> None:
    if override_dir:
        env = {"EDGE_LLM_MODELS_DIR": str(tmp_path / "my-models"), "XDG_DATA_HOME": str(tmp_path / "unused")}
        looked = tmp_path / "my-models" / DEFAULT_MODEL.filename
    else:
        env = {"XDG_DATA_HOME": str(tmp_path / "data")}
        looked = tmp_path / "data" / "edge-llm" / "models" / DEFAULT_MODEL.filename
    result = serve_without_model_flag(tmp_path, env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"edge-llm: error: model file not found: {looked} (the default model; run `edge-llm model fetch` "
        "to download it there, or pass --model PATH)")


@pytest.mark.parametrize("content", [None, b"definitely not a model file, just text" * 4])
def test_a_missing_or_wrong_model_file(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "edge_llm", "serve", "--model", path.name, "--port",
                             str(free_port())], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    message = result.stderr.strip()
    assert message.count("\n") == 0 and message.startswith("edge-llm: error: ")
    if content is None:  # a relative --model is named by the absolute path that was looked at
        assert message.startswith(f"edge-llm: error: model file not found: {path} (from --model, EDGE_LLM_MODEL")
        assert "`edge-llm model fetch`" in message
    else:
        assert "not a GGUF model file" in message


# x86-64 and aarch64 system call numbers → the argument (0-based) that bounds the wait, and how: "ptr" is a
# timeout pointer (NULL = no timeout), "ms" a timeout in milliseconds (-1 = none), "none" a call with no timeout.
_WAITS: dict[str, dict[int, tuple[str, int, str]]] = {
    "x86_64": {202: ("futex", 3, "ptr"), 232: ("epoll_wait", 3, "ms"), 281: ("epoll_pwait", 3, "ms"),
               441: ("epoll_pwait2", 3, "ptr"), 7: ("poll", 2, "ms"), 271: ("ppoll", 2, "ptr"),
               23: ("select", 4, "ptr"), 270: ("pselect6", 4, "ptr"), 0: ("read", 0, "none"),
               45: ("recvfrom", 0, "none"), 43: ("accept", 0, "none"), 288: ("accept4", 0, "none"),
               61: ("wait4", 0, "none"), 34: ("pause", 0, "none")},
    "aarch64": {98: ("futex", 3, "ptr"), 22: ("epoll_pwait", 3, "ms"), 441: ("epoll_pwait2", 3, "ptr"),
                73: ("ppoll", 2, "ptr"), 72: ("pselect6", 4, "ptr"), 63: ("read", 0, "none"),
                207: ("recvfrom", 0, "none"), 202: ("accept", 0, "none"), 242: ("accept4", 0, "none"),
                260: ("wait4", 0, "none")},
}


def _waits_with_a_timeout(pid: int) -> list[str]:
    """Every thread of the process that is not blocked in a wait only an outside event can end (a request, a
    signal): running, blocked elsewhere, or waiting with a timeout, i.e. a thread that will wake up by itself."""
    waits = _WAITS[os.uname().machine]
    awake = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, fields = (task / "comm").read_text().strip(), (task / "syscall").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        call = waits.get(int(fields[0])) if fields[0].lstrip("-").isdigit() else None
        if call is None:
            awake.append(f"{task.name} {name}: {' '.join(fields[:1])}")
            continue
        call_name, argument, kind = call
        value = int(fields[1 + argument], 16)
        if (kind == "ptr" and value != 0) or (kind == "ms" and value & 0xFFFFFFFF != 0xFFFFFFFF):
            awake.append(f"{task.name} {name}: {call_name} with a timeout ({fields[1 + argument]})")
    return awake


def test_the_load_is_a_metric_and_an_idle_server_does_not_wake_up(text_log_server: RunningServer) -> None:
    server = text_log_server
    metrics = httpx.get(server.url + "/metrics").text
    model = MODEL.name.removesuffix(".gguf")
    count = f'edge_llm_model_load_duration_seconds_count{{model="{model}"}} 1.0'
    assert count in metrics, metrics
    total = next(line for line in metrics.splitlines()
                 if line.startswith(f'edge_llm_model_load_duration_seconds_sum{{model="{model}"}}'))
    assert float(total.split()[-1]) > 0
    # No timer runs while nothing is asked (uvicorn's own loop would wake ~10 times a second): once the request
    # above is answered, every thread comes to rest in a wait without a timeout, which nothing but a new request
    # or a signal ends. A timer of any length (an epoll_wait, a timed futex) keeps this from ever holding.
    awake: list[str] = []

    def every_thread_rests() -> bool:
        awake[:] = _waits_with_a_timeout(server.process.pid)
        return not awake

    try:
        wait_for(every_thread_rests, timeout=30, what="every thread of the idle server to rest without a timeout")
    except AssertionError as error:
        raise AssertionError(f"{error}; still awake: {awake}") from None


def _imported(log: str) -> set[str]:
    """The modules a process started with PYTHONPROFILEIMPORTTIME imported (one `import time:` line each)."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines() if line.startswith("import time:")}


def test_what_the_start_up_does_not_import_until_asked(tmp_path: Path) -> None:
    """The start-up imports before the model load begins are on the path to ready (issue 40): the load begins once
    the settings and the model file are checked, before the engine, numpy and the API are imported (they are
    imported beside the load); Jinja (the chat template, compiled by the first chat request) and the `gguf` package
    (its reader and writer, PyYAML; the header walk needs only its tables) are not imported by a server that is
    ready."""
    late = {"jinja2", "gguf", "yaml", "llama_cpp.llama", "diskcache"}
    with run_server(tmp_path, "--ctx-size", "1024", "--parallel", "1", "--cache-slots", "0", "--log-level", "debug",
                    env={"PYTHONPROFILEIMPORTTIME": "1"}) as server:
        log = server.log()
        at_ready = _imported(log)
        assert {"edge_llm.api.app", "edge_llm.models.gguf_info", "edge_llm.engine.llama.bindings"} <= at_ready  # the log is the list
        assert not late & at_ready
        # One stream, written in this order by the main thread: the load's start, then these imports' ends.
        lines = log.splitlines()
        load_begins = next((i for i, line in enumerate(lines) if f"loading {MODEL}" in line), None)
        assert load_begins is not None, "no line says the model load began"
        for module in ("numpy", "edge_llm.registry.setup", "edge_llm.engine.llama.runner", "edge_llm.api.app"):
            imported = next(i for i, line in enumerate(lines)
                            if line.startswith("import time:") and line.rsplit("|", 1)[1].strip() == module)
            assert imported > load_begins, f"{module} was imported before the model load began"
        answer = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        assert "jinja2" in _imported(server.log())
