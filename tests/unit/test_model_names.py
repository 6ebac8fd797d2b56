"""Model names as clients type them (registry/names.py) in the registry and the catalogue, and how Ollama's model
management describes a model (api/serving/ollama_describe.py): pure rules, no model loaded."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edge_llm.api.serving.ollama_describe import (
    capabilities,
    go_time,
    human_number,
    model_info,
    parameters_text,
)
from edge_llm.models.catalogue import GEMMA_3_270M, UnknownCatalogueModel, find, ollama_name_of
from edge_llm.models.fetch import DEFAULT_MODEL
from edge_llm.models.gguf_info import ArrayValue, ModelFacts
from edge_llm.registry.names import (
    NameIndex,
    NameTaken,
    has_tag,
    normalized,
    same_name,
    tagged,
    valid_ollama_name,
)
from edge_llm.registry.registry import ModelState, UnknownModelError
from edge_llm.registry.specs import ModelSpec
from tests.unit.test_registry import Factory, registry, served, spec


def test_a_name_without_a_tag_means_latest_and_the_default_registry_is_implied() -> None:
    assert tagged("qwen2.5-coder") == "qwen2.5-coder:latest"
    assert tagged("gemma3:270m") == "gemma3:270m"
    assert not has_tag("localhost:5000/model")  # a port, not a tag
    assert normalized("registry.ollama.ai/library/Gemma3:270M") == "gemma3:270m"
    assert normalized("library/mine") == normalized("MINE:latest") == "mine:latest"
    assert same_name("gemma3:270m", ["gemma-3-270m", "gemma3:270m"])
    assert same_name("mine", ["mine:latest"]) and same_name("mine:latest", ["mine"])
    assert not same_name("gemma3", ["gemma3:270m"])  # gemma3 is gemma3:latest: another model
    assert not same_name("qwen2.5-coder:0.5", ["qwen2.5-coder:0.5b"])


def test_names_are_valid_as_ollamas_name_rules_say() -> None:
    for name in ("gemma3:270m", "tiny-backup", "qwen2.5-coder:0.5b", "me/mine:v1.2", "_x:_y",
                 "registry.ollama.ai/library/gemma3:270m", "localhost:11434/ns/model:tag", "https://host/ns/model"):
        assert valid_ollama_name(name), name
    for name in ("", "my backup", "a:b:c", "model:", ":tag", "/model", "ns.dotted/model", "-model", "m:-tag",
                 "a/b/c/d", "modèle", "x" * 81, "https://model", "host/ns/m" + ":" + "t" * 81):
        assert not valid_ollama_name(name), name
    assert valid_ollama_name("h" * 350 + "/ns/m") and not valid_ollama_name("h" * 351 + "/ns/m")


def test_the_index_finds_exact_names_first_and_refuses_a_name_spelled_like_another_models() -> None:
    index: NameIndex[str] = NameIndex()
    index.add("Model-A", "a")
    index.add("model-a:latest", "a")  # the same model may have both spellings
    index.add("b:7b", "b")
    assert index.owner("model-a") == "a" and index.owner("MODEL-A:LATEST") == "a" and index.owner("b:7b") == "b"
    assert index.owner("b") is None and index.owner("b:7") is None
    with pytest.raises(NameTaken) as taken:
        index.add("B:7B", "c")
    assert taken.value.owner == "b"
    index.discard_owner("a")
    assert index.owner("model-a") is None


def test_the_catalogue_knows_its_models_by_ollamas_names() -> None:
    assert find("gemma3:270m") is GEMMA_3_270M and find("GEMMA3:270m") is GEMMA_3_270M
    assert find("qwen2.5-coder:0.5b") is DEFAULT_MODEL and find("gemma-3-270m") is GEMMA_3_270M
    with pytest.raises(UnknownCatalogueModel):
        find("gemma3")
    assert ollama_name_of(GEMMA_3_270M.filename) == "gemma3:270m"
    assert ollama_name_of("my-model.Q8_0.gguf") == "my-model.Q8_0:latest"


def test_served_models_answer_to_their_ollama_names_and_ollama_pins_work(tmp_path: Path) -> None:
    specs = served(tmp_path, "gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "own.gguf",
                   pin=["gemma3:270m"], model_aliases={"tiny": "gemma3:270m"})
    assert [s.ollama_name for s in specs] == ["qwen2.5-coder:0.5b", "gemma3:270m", "own:latest"]
    assert [s.pinned for s in specs] == [False, True, False]
    assert specs[1].aliases == ("gemma-3-270m", "tiny")
    reg = registry(Factory(), *specs)
    assert reg.resolve("own").name == "own" and reg.resolve("registry.ollama.ai/library/own:latest").name == "own"
    assert reg.resolve("Gemma3:270m").name == "gemma-3-270m-q4_k_m"
    assert reg.resolve(None).name == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    with pytest.raises(UnknownModelError) as unknown:
        reg.resolve("gemma3")
    assert "gemma3:270m" in unknown.value.available


def test_two_files_whose_names_differ_only_in_case_are_refused(tmp_path: Path) -> None:
    from edge_llm.registry.specs import ModelSpecError

    with pytest.raises(ModelSpecError, match="two models are called"):
        served(tmp_path, "Mine.gguf", "mine.gguf")


def test_copies_added_models_and_removed_models_in_the_registry() -> None:
    reg = registry(Factory(), spec("a"), spec("b"))
    a = reg.resolve("a")
    reg.add_copy("backup", a)
    assert reg.resolve("backup:latest") is a and "backup" in a.names
    with pytest.raises(NameTaken):
        reg.add_copy("b-alias", a)  # another model's name
    assert reg.remove_copy("b") is None  # not a copy: nothing forgotten
    assert reg.remove_copy("backup") is a and "backup" not in a.names
    with pytest.raises(UnknownModelError):
        reg.resolve("backup")
    added = reg.add(ModelSpec("c", Path("/models/c.gguf"), ollama_name="c:1b"))
    assert reg.resolve("c:1b") is added and added.keep_alive == reg.default_keep_alive
    with pytest.raises(NameTaken):
        reg.add(ModelSpec("d", Path("/models/d.gguf"), aliases=("C:1B",)))
    reg.remove(added)
    with pytest.raises(UnknownModelError):
        reg.resolve("c")


def test_a_loaded_model_is_not_removed() -> None:
    factory = Factory()
    reg = registry(factory, spec("a"))

    async def test() -> None:
        reg.start()
        factory.gate("a").set()
        entry = await reg.load("a")
        assert entry.state is ModelState.LOADED
        with pytest.raises(ValueError):
            reg.remove(entry)

    asyncio.run(asyncio.wait_for(test(), 20))


def test_parameter_sizes_and_times_as_ollama_writes_them() -> None:
    assert human_number(494_032_768) == "494.03M"
    assert human_number(630_167_424) == "630.17M"
    assert human_number(7_000_000_000) == "7B" and human_number(7_615_616_512) == "7.6B"
    assert human_number(268_000_000) == "268M" and human_number(1_500) == "2K" and human_number(12) == "12"
    moment = datetime(2025, 5, 10, 15, 6, 48, 639712, tzinfo=timezone.utc)
    text = go_time(moment)
    assert datetime.fromisoformat(text.replace("Z", "+00:00")) == moment
    assert "." not in go_time(moment.replace(microsecond=0))  # no fraction when there is none, as Go writes it


def facts(metadata: dict, path: Path = Path("/m.gguf")) -> ModelFacts:
    return ModelFacts(path=path, file_size=1, gguf_version=3, architecture=str(metadata["general.architecture"]),
                      name="x", parameter_count=494_032_768, tensor_count=1, tensor_data_bytes=1, file_type="Q4_K_M",
                      tensor_types={}, context_length=None, block_count=None, embedding_length=None, head_count=None,
                      head_count_kv=None, key_length=None, value_length=None, vocab_size=None,
                      has_chat_template=False, metadata=metadata)


def test_model_info_hides_long_arrays_the_name_and_template_and_prints_float32_as_go_does() -> None:
    header = facts({"general.architecture": "qwen2", "general.name": "Secret", "tokenizer.chat_template": "{{ x }}",
                    "qwen2.context_length": 32768, "qwen2.attention.layer_norm_rms_epsilon": 9.999999974752427e-07,
                    "general.tags": ArrayValue("STRING", 2, ["a", "b"]),
                    "tokenizer.ggml.merges": ArrayValue("STRING", 9, None),
                    "tokenizer.ggml.token_type": ArrayValue("INT32", 6, [1, 1, 1, 1, 1, 3])})
    info = model_info(header, verbose=False)
    assert "general.name" not in info and "tokenizer.chat_template" not in info
    assert info["qwen2.context_length"] == 32768 and info["general.parameter_count"] == 494_032_768
    assert info["qwen2.attention.layer_norm_rms_epsilon"] == 1e-06
    assert info["general.tags"] == ["a", "b"]
    assert info["tokenizer.ggml.merges"] == [] and info["tokenizer.ggml.token_type"] == []
    assert model_info(header, verbose=True)["tokenizer.ggml.token_type"] == [1, 1, 1, 1, 1, 3]


def test_capabilities_follow_ollamas_rules_and_never_claim_vision_or_thinking() -> None:
    chat = {"general.architecture": "qwen2", "tokenizer.chat_template": "{% if tools %}<tool_call>{% endif %}"}
    assert capabilities(facts(chat), has_fim=True) == ["completion", "tools", "insert"]
    assert capabilities(facts({"general.architecture": "gemma3"}), has_fim=False) == ["completion"]
    embedder = {"general.architecture": "bert", "bert.pooling_type": 1}
    assert capabilities(facts(embedder), has_fim=False) == ["embedding"]
    thinker = {"general.architecture": "qwen3", "tokenizer.chat_template": "<think>\n</think>",
               "vision.block_count": 4}
    assert capabilities(facts(thinker), has_fim=False) == ["completion"]


def test_parameters_are_padded_to_thirty_columns_with_go_values() -> None:
    text = parameters_text({"num_ctx": 4096, "temperature": 0.7, "top_p": 1.0, "stop": "<|im_end|>"})
    assert text.splitlines() == ["num_ctx" + " " * 24 + "4096", "temperature" + " " * 20 + "0.7",
                                 "top_p" + " " * 26 + "1", "stop" + " " * 27 + '"<|im_end|>"']


def test_the_expiry_of_a_model_never_unloaded_is_centuries_away() -> None:
    from edge_llm.api.serving.ollama_describe import expiry

    never = datetime.fromisoformat(expiry(None).replace("Z", "+00:00"))
    assert never - datetime.now(timezone.utc) > timedelta(days=365 * 200)
    soon = datetime.fromisoformat(expiry(300).replace("Z", "+00:00"))
    assert timedelta(seconds=290) < soon - datetime.now(timezone.utc) <= timedelta(seconds=300)
