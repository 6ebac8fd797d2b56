"""Ollama's model management against real servers, through the official `ollama` Python package (pinned in the
test extras): list (/api/tags), show, ps, version, pull of a catalogue model, copy and delete; the "is Ollama
running" probes (HEAD /, GET / without text/html); Ollama's names (`gemma3:270m`, `:latest` implied) in every
family, and an unknown model as Ollama's 404.

Nothing is downloaded: the models pulled are in the local models directory already (`edge-llm model fetch`), which
a pull into another directory reuses."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import ollama
import pytest

from edge_llm.models.catalogue import GEMMA_3_270M
from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.testing.server import MODEL, RunningServer, require_model, run_server
from tests.helpers import small_model

pytestmark = pytest.mark.integration

QWEN = "qwen2.5-coder:0.5b"
GEMMA = "gemma3:270m"


def client(server: RunningServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Serves a directory of its own holding both models (links), so deleting one changes nothing elsewhere."""
    gemma = small_model()
    directory = tmp_path_factory.mktemp("ollama-models")
    (directory / MODEL.name).symlink_to(require_model())
    (directory / gemma.name).symlink_to(gemma)
    with run_server(tmp_path_factory.mktemp("ollama-log"), "--models-dir", str(directory), "--ctx-size", "2048",
                    "--parallel", "2", "--cache-slots", "0", model=None) as running:
        yield running


# ---- one model (--model alone) ----------------------------------------------------------------------------------


def test_list_shows_the_served_model_with_ollamas_fields(server: RunningServer) -> None:
    listed = client(server).list()
    assert [model.model for model in listed.models] == [QWEN]
    (model,) = listed.models
    assert model.digest == DEFAULT_MODEL.sha256 and model.size == DEFAULT_MODEL.size
    assert model.modified_at is not None and model.modified_at.tzinfo is not None
    assert model.details is not None
    assert (model.details.format, model.details.family, model.details.families) == ("gguf", "qwen2", ["qwen2"])
    assert model.details.quantization_level == "Q4_K_M" and model.details.parameter_size == "630.17M"
    raw = httpx.get(server.url + "/api/tags", timeout=30).json()["models"][0]
    assert raw["name"] == QWEN and raw["details"]["parent_model"] == ""


def test_show_reports_the_gguf_facts_template_and_capabilities(server: RunningServer) -> None:
    shown = client(server).show("qwen2.5-coder:0.5b")
    assert shown.capabilities == ["completion", "tools", "insert"]
    assert shown.template and "<|im_start|>" in shown.template  # the GGUF's chat template
    # Continue decides FIM support by ".Suffix" in the template: the FIM layout leads it, with the model's tokens
    assert shown.template.startswith("{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}"
                                     "<|fim_middle|>")
    assert shown.modelinfo is not None
    info = shown.modelinfo
    assert info["general.architecture"] == "qwen2" and info["qwen2.context_length"] == 32768
    assert info["qwen2.embedding_length"] == 896 and info["general.parameter_count"] == 630_167_424
    assert info["tokenizer.ggml.tokens"] == []  # long arrays only when verbose
    assert "general.name" not in info and "tokenizer.chat_template" not in info
    assert shown.details is not None and shown.details.quantization_level == "Q4_K_M"
    assert shown.parameters is not None and "num_ctx" in shown.parameters
    verbose = httpx.post(server.url + "/api/show", json={"name": "QWEN2.5-coder:0.5b", "verbose": True},
                         timeout=120).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 151936
    assert verbose["model_info"]["tokenizer.ggml.tokens"][0] == "!"
    copilot = httpx.post(server.url + "/api/show", json={"model": QWEN},
                         headers={"User-Agent": "GitHubCopilotChat/0.30.0"}, timeout=60).json()
    assert copilot["model_info"]["general.basename"] == QWEN  # Copilot names the model by it, as Ollama does


def test_an_unknown_model_is_ollamas_404_on_every_route(server: RunningServer) -> None:
    with pytest.raises(ollama.ResponseError) as shown:
        client(server).show("gemma3")
    assert (shown.value.status_code, shown.value.error) == (404, "model 'gemma3' not found")
    reply = httpx.post(server.url + "/api/show", json={}, timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": "model is required"})
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                       json={"model": "qwen2.5-coder:1.5b", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"  # OpenAI's envelope
    assert QWEN in reply.json()["error"]["message"]  # among the names it lists


def test_every_family_takes_ollamas_names_for_the_served_model(server: RunningServer) -> None:
    for name in (QWEN, "QWEN2.5-Coder:0.5B", "registry.ollama.ai/library/qwen2.5-coder:0.5b"):
        reply = httpx.post(server.url + "/v1/completions", timeout=120,
                           json={"model": name, "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200, reply.text


def test_ps_version_and_the_probes(server: RunningServer) -> None:
    running = client(server).ps()
    (model,) = running.models
    assert (model.name, model.model, model.size_vram, model.digest) == (QWEN, QWEN, 0, DEFAULT_MODEL.sha256)
    assert model.size and model.size > DEFAULT_MODEL.size // 2 and model.context_length == 8192
    assert model.expires_at is not None and model.expires_at - datetime.now(timezone.utc) > timedelta(days=36500)
    version = httpx.get(server.url + "/api/version", timeout=30).json()["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 6, 4)  # VS Code Copilot Chat's minimum
    assert httpx.head(server.url + "/", timeout=30).status_code == 200
    assert httpx.head(server.url + "/api/version", timeout=30).status_code == 200
    probe = httpx.get(server.url + "/", timeout=30)
    assert (probe.status_code, probe.text) == (200, "Ollama is running")
    page = httpx.get(server.url + "/", headers={"Accept": "text/html,application/xhtml+xml"}, timeout=30)
    assert page.headers["content-type"].startswith("text/html") and "<title>Edge LLM chat</title>" in page.text


def test_create_and_push_are_refused_as_not_offered(server: RunningServer) -> None:
    for path in ("/api/create", "/api/push"):
        reply = httpx.post(server.url + path, json={"model": "mine"}, timeout=30)
        assert reply.status_code == 501 and "not offered" in reply.json()["error"]


def test_pull_of_a_catalogue_model_streams_ollamas_statuses_and_ends_in_success(server: RunningServer) -> None:
    statuses = list(client(server).pull(GEMMA, stream=True))
    assert statuses[0].status == "pulling manifest"
    pulling = [s for s in statuses if s.status == f"pulling {GEMMA_3_270M.sha256[:12]}"]
    assert pulling and all(s.digest == "sha256:" + GEMMA_3_270M.sha256 and s.total == GEMMA_3_270M.size
                           for s in pulling)
    assert pulling[-1].completed == GEMMA_3_270M.size
    assert [s.status for s in statuses[-3:]] == ["writing manifest", statuses[-2].status, "success"]
    assert "--models-dir" in (statuses[-2].status or "")  # with --model alone: where it went, how to serve it
    assert "verifying sha256 digest" in [s.status for s in statuses]
    assert [model.model for model in client(server).list().models] == [QWEN]  # still one model served
    with pytest.raises(ollama.ResponseError) as unknown:
        client(server).pull("llama3.2")
    assert "file does not exist" in unknown.value.error
    reply = httpx.post(server.url + "/api/pull", json={"model": "llama3.2", "stream": False}, timeout=30)
    assert reply.status_code == 404 and "not in the catalogue" in reply.json()["error"]


# ---- many models (--models-dir) ---------------------------------------------------------------------------------


def test_list_shows_every_model_the_directory_serves_loaded_or_not(models_server: RunningServer) -> None:
    listed = {model.model: model for model in client(models_server).list().models}
    assert set(listed) >= {QWEN, GEMMA}
    assert listed[GEMMA].digest == GEMMA_3_270M.sha256 and listed[GEMMA].details.family == "gemma3"
    shown = client(models_server).show(GEMMA)
    assert shown.capabilities == ["completion"]  # a base model: no tools, no FIM
    assert ".Suffix" not in (shown.template or "")


def test_copy_gives_a_name_that_every_family_serves_and_delete_forgets_it(models_server: RunningServer) -> None:
    ollama_client = client(models_server)
    ollama_client.copy(GEMMA, "tiny-backup")
    assert "tiny-backup:latest" in [model.model for model in ollama_client.list().models]
    reply = httpx.post(models_server.url + "/v1/completions", timeout=300,
                       json={"model": "tiny-backup", "prompt": "The capital of France is", "max_tokens": 2})
    assert reply.status_code == 200 and reply.json()["model"] == "tiny-backup"  # the name it was asked by
    running = {model.model: model for model in ollama_client.ps().models}
    assert GEMMA in running
    left = running[GEMMA].expires_at - datetime.now(timezone.utc)
    assert timedelta(seconds=200) < left <= timedelta(seconds=300)  # the --models-dir default keep_alive, 5m
    with pytest.raises(ollama.ResponseError) as taken:
        ollama_client.copy(GEMMA, QWEN)
    assert taken.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as missing:
        ollama_client.copy("nope", "other")
    assert (missing.value.status_code, missing.value.error) == (404, 'model "nope" not found')
    for bad in ("my backup", "a:b:c", "ns.with.dots/model"):  # names Ollama refuses, as it words it
        with pytest.raises(ollama.ResponseError) as invalid:
            ollama_client.copy(GEMMA, bad)
        assert (invalid.value.status_code, invalid.value.error) == (400, f'destination "{bad}" is invalid')
    ollama_client.delete("tiny-backup:latest")
    assert "tiny-backup:latest" not in [model.model for model in ollama_client.list().models]
    assert GEMMA in [model.model for model in ollama_client.list().models]  # the model itself stays


def test_delete_refuses_a_loaded_model_then_removes_it_and_pull_brings_it_back(models_server: RunningServer) -> None:
    ollama_client = client(models_server)
    httpx.post(models_server.url + "/models/load", json={"model": GEMMA}, timeout=300).raise_for_status()
    with pytest.raises(ollama.ResponseError) as loaded:
        ollama_client.delete(GEMMA)
    assert loaded.value.status_code == 409 and "unload it first" in loaded.value.error
    httpx.post(models_server.url + "/models/unload", json={"model": GEMMA}, timeout=300).raise_for_status()
    ollama_client.delete(GEMMA)
    assert GEMMA not in [model.model for model in ollama_client.list().models]
    gone = httpx.post(models_server.url + "/v1/completions", json={"model": GEMMA, "prompt": "x"}, timeout=30)
    assert gone.status_code == 404
    with pytest.raises(ollama.ResponseError) as again:
        ollama_client.delete(GEMMA)
    assert (again.value.status_code, again.value.error) == (404, f"model '{GEMMA}' not found")

    lines = httpx.post(models_server.url + "/api/pull", json={"model": GEMMA}, timeout=300)
    assert lines.headers["content-type"] == "application/x-ndjson"
    statuses = [json.loads(line) for line in lines.text.splitlines()]
    assert statuses[-1] == {"status": "success"} and statuses[0] == {"status": "pulling manifest"}
    listed = {model.model: model for model in ollama_client.list().models}
    assert listed[GEMMA].digest == GEMMA_3_270M.sha256
    answer = httpx.post(models_server.url + "/v1/completions", timeout=300,
                        json={"model": GEMMA, "prompt": "The capital of France is", "max_tokens": 2})
    assert answer.status_code == 200


def test_the_file_given_by_model_is_never_deleted(server: RunningServer) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        client(server).delete(QWEN)
    assert refused.value.status_code == 409 and "--model" in refused.value.error
    assert hashlib.sha256(Path(MODEL).read_bytes()[:1 << 20]).hexdigest()  # still there and readable


# ---- Ollama's CLI verbs ----------------------------------------------------------------------------------------


def verb(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`edge-llm VERB ...` against the server, as a person types it (OLLAMA_HOST names the server, as for Ollama)."""
    env = {**os.environ, "OLLAMA_HOST": server.url.removeprefix("http://")}
    return subprocess.run([sys.executable, "-m", "edge_llm", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_list_ps_and_run_verbs_talk_to_the_running_server(models_server: RunningServer) -> None:
    listed = verb(models_server, "list")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    names = {row.split()[0] for row in rows}
    assert {QWEN, GEMMA} <= names
    assert any(row.startswith(QWEN) and DEFAULT_MODEL.sha256[:12] in row for row in rows)

    answered = verb(models_server, "run", QWEN, "Say", "OK.")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip()
    loaded = verb(models_server, "ps")
    assert loaded.returncode == 0, loaded.stderr
    header, *rows = loaded.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]
    assert any(row.startswith(QWEN) and "100% CPU" in row and row.endswith("minutes from now") for row in rows), \
        loaded.stdout  # the --models-dir keep_alive, 5 minutes, as Ollama's ps words it


def test_pull_verb_prints_the_servers_progress_and_unknown_names_fail_in_one_line(models_server: RunningServer
                                                                                 ) -> None:
    pulled = verb(models_server, "pull", GEMMA)
    assert pulled.returncode == 0, pulled.stderr
    lines = pulled.stdout.splitlines()
    assert lines[0] == "pulling manifest" and lines[-1] == "success", pulled.stdout
    unknown = verb(models_server, "pull", "no-such-model:7b")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("edge-llm: error: ") and len(unknown.stderr.strip().splitlines()) == 1
    unreachable = subprocess.run([sys.executable, "-m", "edge_llm", "list", "--host", "http://127.0.0.1:9"],
                                 capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1 and "could not reach the server" in unreachable.stderr
