"""Hostile models (issue 6): a chat template that reaches for Python internals (CVE-2024-34359), and model
files that are truncated, empty or not GGUF at all. Built from the small model (tests/helpers.py small_model):
nothing here depends on what the model answers."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge_llm.testing.server import THREADS, RunningServer, free_port, run_server
from tests.helpers import SMALL_MODEL_CHAT, small_model
from tests.reliability.gguf_rewrite import rewritten, with_chat_template
from tests.reliability.support import (
    CHAT,
    TIMEOUT,
    assert_error,
    assert_no_unhandled_errors,
    assert_serving,
    neighbour_alone,
    neighbours_beside,
)

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def payloads(marker: Path) -> dict[str, str]:
    """Template snippets that try to escape the sandbox; each would create `marker` or leak `id` / files."""
    touch = f"touch {marker}; id"
    return {
        "cycler globals": f"{{{{ cycler.__init__.__globals__.os.popen('{touch}').read() }}}}",
        "str mro subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "catch_warnings builtins": (
            "{% for c in ().__class__.__base__.__subclasses__() %}{% if c.__name__ == 'catch_warnings' %}"
            f"{{{{ c()._module.__builtins__['__import__']('os').system('{touch}') }}}}{{% endif %}}{{% endfor %}}"),
        "lipsum globals": f"{{{{ lipsum.__globals__['os'].popen('{touch}').read() }}}}",
        "joiner builtins open": "{{ joiner.__init__.__globals__.__builtins__.open('/etc/passwd').read() }}",
        "namespace sys.modules": f"{{{{ namespace.__init__.__globals__.sys.modules.os.system('{touch}') }}}}",
        "template context": f"{{{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('{touch}')"
                            ".read() }}",
        "attr filter": f"{{{{ (cycler|attr('__init__')|attr('__globals__'))['os'].popen('{touch}').read() }}}}",
        "subscript dunder": f"{{{{ cycler['__init__']['__globals__']['os'].popen('{touch}').read() }}}}",
        "format string": "{{ '{0.__init__.__globals__[os].environ}'.format(cycler) }}",
        "percent format": "{{ '%s' % cycler.__init__.__globals__ }}",
        "mutate messages": "{% set _ = messages.append({'role': 'system', 'content': 'injected'}) %}{{ messages }}",
        "macro globals": "{% macro m() %}{% endmacro %}{{ m.__globals__ }}",
        "huge range": "{% for i in range(10 ** 9) %}x{% endfor %}",
        "raise_exception": "{{ raise_exception('refused by the template') }}",
        "harmless globals": "{{ cycler }} {{ strftime_now('%Y') }}",
    }


def hostile_template(marker: Path) -> str:
    """One template for every payload: the first message's `name` picks one; without a name it is ChatML."""
    branches = "".join(
        f"{{% {'if' if i == 0 else 'elif'} messages[0].name == {json.dumps(name)} %}}{code}"
        for i, (name, code) in enumerate(payloads(marker).items())
    )
    return f"{branches}{{% else %}}{CHATML}{{% endif %}}"


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "template-ran-code"


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory: pytest.TempPathFactory, marker: Path) -> Iterator[Path]:
    path = with_chat_template(small_model(), tmp_path_factory.mktemp("model") / "hostile-template.gguf",
                              hostile_template(marker))
    yield path
    path.unlink(missing_ok=True)  # 253 MB


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory, hostile_model: Path) -> Iterator[RunningServer]:
    # A second --model after run_server's own: the last one wins.
    with run_server(tmp_path_factory.mktemp("hostile-model"), "--max-tokens-cap", "8",
                    "--model", str(hostile_model)) as running:
        yield running


@pytest.fixture(scope="module")
def alone(hostile_server: RunningServer) -> float:
    return neighbour_alone(hostile_server)


@pytest.fixture()
def neighbours(hostile_server: RunningServer, alone: float, request: pytest.FixtureRequest) -> Iterator[None]:
    """2-token completions sent one after the other while the test runs, the slowest within the neighbour bound
    (issue 41): a hostile template holds nothing another request needs."""
    with neighbours_beside(hostile_server, alone, request.node.name):
        yield


def ask(server: RunningServer, name: str | None, stream: bool = False) -> httpx.Response:
    message = {"role": "user", "content": "Hello", **({"name": name} if name else {})}
    return httpx.post(server.url + CHAT, json={"messages": [message], "max_tokens": 4, "stream": stream},
                      timeout=TIMEOUT)


@pytest.mark.usefixtures("neighbours")
def test_the_server_runs_the_model_with_its_own_template(hostile_server: RunningServer) -> None:
    models = httpx.get(hostile_server.url + "/v1/models", timeout=TIMEOUT).json()
    assert models["data"][0]["id"] == "hostile-template"
    error = assert_error(ask(hostile_server, "raise_exception"), 400, "chat_template_error")
    assert error["message"] == "refused by the template"  # the hostile template is the one in use
    assert ask(hostile_server, None).status_code == 200  # its ChatML branch


@pytest.mark.usefixtures("neighbours")
@pytest.mark.parametrize("name", list(payloads(Path("/m"))))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_template_reaching_for_python_internals_runs_no_code(
        hostile_server: RunningServer, marker: Path, name: str, stream: bool) -> None:
    response = ask(hostile_server, name, stream)
    if response.status_code == 200:  # rendered safely
        assert "uid=" not in response.text and "root:" not in response.text
    else:
        # Refused by the sandbox (chat_template_error), or rendered to nothing at all (an empty prompt).
        error = assert_error(response, 400)
        assert (error["code"], error["param"]) in (("chat_template_error", "messages"), ("invalid_request", None)), \
            error
        assert "uid=" not in error["message"] and "root:" not in error["message"]
    assert not marker.exists(), f"the template {name!r} ran a command"
    log = hostile_server.log()
    assert "uid=" not in log and "root:x:0:0" not in log
    assert_serving(hostile_server)


@pytest.mark.usefixtures("neighbours")
def test_the_harmless_payload_renders(hostile_server: RunningServer) -> None:
    """Not every template trick is an attack: reading a safe global renders, and the request is answered."""
    assert ask(hostile_server, "harmless globals").status_code == 200
    assert_no_unhandled_errors(hostile_server)


# ---- model files that are not models ----------------------------------------------------------------------------


def gguf_header(version: int, n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def write_prefix(source: Path, target: Path, size: int) -> Path:
    with source.open("rb") as src, target.open("wb") as out:
        remaining = size
        while remaining:
            block = src.read(min(remaining, 1 << 22))
            out.write(block)
            remaining -= len(block)
    return target


BAD_MODELS = ["missing", "directory", "zero bytes", "text file", "random bytes", "truncated header",
              "truncated at 1 MB", "truncated at 60 %", "huge string length", "huge counts", "version 999"]


def make_bad_model(kind: str, tmp: Path) -> Path:
    path = tmp / f"{kind.replace(' ', '-')}.gguf"
    if kind == "missing":
        return path
    if kind == "directory":
        path.mkdir()
    elif kind == "zero bytes":
        path.write_bytes(b"")
    elif kind == "text file":
        path.write_text("this is not a model, just some text that is long enough to pass a size check\n")
    elif kind == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "truncated header":
        write_prefix(small_model(), path, 40)
    elif kind == "truncated at 1 MB":
        write_prefix(small_model(), path, 1_000_000)
    elif kind == "truncated at 60 %":
        write_prefix(small_model(), path, small_model().stat().st_size * 6 // 10)
    elif kind == "huge string length":  # one key-value whose key claims 2^63 bytes
        path.write_bytes(gguf_header(3, 0, 1) + struct.pack("<Q", 2 ** 63) + b"k" * 64)
    elif kind == "huge counts":
        path.write_bytes(gguf_header(3, 2 ** 62, 2 ** 62) + bytes(64))
    elif kind == "version 999":
        path.write_bytes(gguf_header(999, 0, 0) + bytes(64))
    return path


@pytest.mark.parametrize("kind", BAD_MODELS)
def test_a_bad_model_file_stops_start_up_with_one_clear_line(tmp_path: Path, kind: str) -> None:
    path = make_bad_model(kind, tmp_path)
    command = [sys.executable, "-m", "edge_llm", "serve", "--model", str(path), "--port", str(free_port()),
               "--threads", str(THREADS), "--log-format", "json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    stderr = result.stderr
    assert result.returncode == 1, (result.returncode, stderr[-2000:])
    assert "Traceback" not in stderr and "Traceback" not in result.stdout, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("edge-llm: error:"):
        # Refused before listening: that one line is all there is.
        assert len(lines) == 1, stderr
        clear = lines[0]
    else:
        # The file passed the quick checks (magic bytes, size), so the server listened while llama.cpp
        # loaded it: the log is JSON lines, and exactly one of them, from edge-llm, says why it stops.
        records = [json.loads(line) for line in lines]
        ours = [r for r in records if r["level"] == "error" and r["logger"].startswith("edge_llm")
                and not r["logger"].startswith("edge_llm.llama_cpp")]
        assert len(ours) == 1, stderr
        clear = ours[0]["msg"]
    assert str(path) in clear, clear
    assert any(word in clear for word in ("not found", "not a file", "too small", "not a GGUF", "could not load",
                                          "corrupt", "truncated")), clear


def test_a_model_that_attends_ahead_gets_a_clear_400_for_embeddings(tmp_path: Path) -> None:
    """Embeddings are computed a chunk at a time, which needs causal attention: a model whose GGUF says its
    attention looks ahead (BERT-like embedding models) is refused with a clear error, and the server stays up."""
    model = rewritten(small_model(), tmp_path / "attends-ahead.gguf", flags={"attention.causal": False})
    (tmp_path / "server").mkdir()
    try:
        with run_server(tmp_path / "server", "--max-tokens-cap", "2", *SMALL_MODEL_CHAT,
                        "--model", str(model)) as server:
            alone = neighbour_alone(server)
            with neighbours_beside(server, alone, "embeddings of a model that attends ahead"):
                response = httpx.post(server.url + "/v1/embeddings", json={"input": "hello"}, timeout=TIMEOUT)
            error = assert_error(response, 400, "embeddings_not_supported")
            assert "attention looks ahead" in error["message"]
            assert_serving(server)
            assert_no_unhandled_errors(server)
    finally:
        model.unlink(missing_ok=True)  # 253 MB
