"""llama-server's dialect: its `/infill` request, as editor plugins (llama.vscode, llama.vim) send it, and the
native fields its clients also send in OpenAI bodies (`LlamaServerFields`).

The plugins send llama-server's whole parameter set (`samplers`, `id_slot`, …): fields this server does not
know are ignored and named in the `X-Edge-LLM-Ignored-Fields` header, as for every body (api/params.py).
Errors use OpenAI's envelope (protocol/errors.py), as llama-server does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from edge_llm.api.protocol.common import MAX_STOP_STRINGS, RequestModel, SamplingDefaults, unreadable
from edge_llm.engine.types import SamplingParams

MAX_EXTRA_FILES = 64
MAX_PROMPTS = 16  # prompts in one /completion request: each is a sequence in the batch, answered on its own

Prompt = list[int | str]  # one prompt: pieces of text and token ids, in order (llama-server's tokenize_mixed)


def native_sampling(defaults: SamplingDefaults, fields: Any, grammar: str | None) -> SamplingParams:
    """The sampling of llama-server's and Ollama's native bodies (their option names are the same): the server's
    defaults (--temperature, --top-p, --top-k) where a field is None; a seed below 0 means a random one."""
    seed = getattr(fields, "seed", None)
    return SamplingParams(
        temperature=defaults.temperature if fields.temperature is None else fields.temperature,
        top_p=defaults.top_p if fields.top_p is None else fields.top_p,
        top_k=defaults.top_k if fields.top_k is None else fields.top_k,
        min_p=fields.min_p or 0.0,
        seed=None if seed is None or seed < 0 else seed & 0xFFFFFFFF,
        presence_penalty=getattr(fields, "presence_penalty", None) or 0.0,
        frequency_penalty=getattr(fields, "frequency_penalty", None) or 0.0,
        repeat_penalty=fields.repeat_penalty or 1.0,
        ignore_eos=getattr(fields, "ignore_eos", False),
        grammar=grammar,
    )


class LlamaServerFields(BaseModel):
    """llama-server's native fields, honoured in the OpenAI bodies too (tools written for llama-server send them)."""

    n_predict: int | None = Field(None, ge=-1)  # max_tokens; -1: until the answer ends or the context is full
    grammar: str | None = Field(None, min_length=1)  # GBNF with a `root` rule, bounded as response grammars are
    json_schema: dict[str, Any] | None = None  # the answer follows this JSON schema
    cache_prompt: bool = True  # false: this request neither reuses nor leaves a prefix-cache entry
    n_probs: int | None = Field(None, ge=0, le=20)  # the chosen token's logprob and the n likeliest

    def native_max_tokens(self) -> int | None:
        return self.n_predict if self.n_predict is not None and self.n_predict > 0 else None


class ExtraChunk(RequestModel):
    text: str
    filename: str = Field("tmp", max_length=1024)


class NativeGeneration(RequestModel):
    """What llama-server's own generation routes (/infill, /completion) share."""

    model: str | None = None
    n_predict: int = Field(-1, ge=-1)  # -1: until the answer ends or the context is full
    max_tokens: int | None = Field(None, ge=1)  # an alias of n_predict, as llama-server accepts
    n_indent: int = Field(0, ge=0, le=1024)
    t_max_predict_ms: float = Field(0, ge=0)
    t_max_prompt_ms: float = Field(0, ge=0)  # accepted; prompts here are never cut short
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1000)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-1, le=2**64 - 1)  # -1: a random seed, as in llama-server
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    cache_prompt: bool = True  # false: this request neither reuses nor leaves a prefix-cache entry
    speculative: bool = True  # false: no speculative decoding for this request (see --speculative)
    ignore_eos: bool = False  # end-of-generation tokens are never sampled: the answer runs to n_predict
    response_fields: list[str] | None = Field(None, max_length=64)
    return_progress: bool = False  # a stream also sends `prompt_progress` chunks while the prompt is computed
    return_tokens: bool = False  # the token ids in `tokens`: each chunk's, and all of them in a whole answer
    n_probs: int = Field(0, ge=0, le=20)  # `completion_probabilities`: each token's logprob and the n likeliest
    post_sampling_probs: bool = False  # `prob` / `top_probs` (probabilities) instead of `logprob` / `top_logprobs`
    input_suffix: str = ""  # /infill's text after the cursor; a completion has none
    # llama-server's: [[token id or text, bias], …] or {"token id or text": bias}; a bias of false bans the token(s)
    logit_bias: list[Any] | dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @property
    def warm_only(self) -> bool:
        """n_predict 0: only the prompt is computed (llama.vim warms the prefix cache with its context chunks)."""
        return self.max_tokens is None and self.n_predict == 0

    def requested_max_tokens(self) -> int | None:
        if self.max_tokens is not None:
            return self.max_tokens
        if self.warm_only:
            return 1  # the prompt's KV stays in the prefix cache; the one token is not sent
        return None if self.n_predict == -1 else self.n_predict

    def sampling_params(self, defaults: SamplingDefaults, grammar: str | None = None) -> SamplingParams:
        return native_sampling(defaults, self, grammar)

    @property
    def logprobs(self) -> int | None:
        """What the engine reports per token: the n_probs likeliest, or only the token itself for its id."""
        return self.n_probs if self.n_probs else (0 if self.return_tokens else None)


def bias_entries(value: list[Any] | dict[str, Any] | None) -> list[tuple[int | str, float]]:
    """llama-server's logit_bias (server-schema.cpp) as (token id or text, bias) pairs, in order: a text stands for
    every token of it, `false` is minus infinity; entries it skips (not a pair, a bias neither a number nor false)
    are skipped here too."""
    if isinstance(value, dict):
        keyed = [(int(key) if _integer_text(key) else key, raw) for key, raw in value.items()]
    else:
        keyed = [(key, raw) for key, raw in (el for el in value or [] if _is_pair(el))
                 if is_token_id(key) or isinstance(key, str)]
    return [(key, bias) for key, raw in keyed if (bias := _bias(raw)) is not None]


def _bias(raw: Any) -> float | None:
    if raw is False:
        return float("-inf")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    return None


def _is_pair(element: Any) -> bool:
    return isinstance(element, list) and len(element) == 2


def _integer_text(key: str) -> bool:
    return key.lstrip("-").isdigit()


class InfillRequest(NativeGeneration):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_FILES)
    prompt: str = ""  # text placed after the prefix, at the cursor (llama.vim sends the typed part of the line)


class NativeCompletionRequest(NativeGeneration):
    """llama-server's POST /completion: raw prompts, no chat template. `prompt` takes the shapes of llama-server's
    tokenize_input_prompts: a string, token ids, text and ids mixed, `{"prompt_string": …}`, or a list of these
    (several prompts, one answer each); it is read into `prompts`."""

    prompt: Any = Field(description="text, token ids, both mixed, {prompt_string}, or a list of these prompts")
    grammar: str | None = Field(None, min_length=1)
    json_schema: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> list[Prompt]:
        return split_prompts(value)

    @property
    def prompts(self) -> list[Prompt]:
        return self.prompt  # type: ignore[no-any-return]  # split_prompts made it a list of prompts


_SHAPES = ("a string, a list of token ids and strings, an object with 'prompt_string', or a list of these "
           f"(at most {MAX_PROMPTS} prompts)")


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def one_or_several(value: Any, *, limit: int, noun: str) -> list[tuple[Any, str]]:
    """llama-server's reading of a prompt field (tokenize_input_prompts): a list that holds a token id anywhere at its
    top is ONE item (ids and text mixed); any other list is several, anything else one. Each item with the label its
    errors start with ('' when there is one item)."""
    single = not isinstance(value, list) or any(is_token_id(item) for item in value)
    items = [value] if single else value
    if not items:
        raise ValueError("must not be empty")
    if len(items) > limit:
        raise ValueError(f"at most {limit} {noun}s per request (got {len(items)})")
    return [(item, "" if single else f"{noun} {index}: ") for index, item in enumerate(items)]


def split_prompts(value: Any) -> list[Prompt]:
    """The prompts of `value`, read as llama-server reads them (one_or_several)."""
    if not isinstance(value, (str, dict, list)):
        raise ValueError(f"must be {_SHAPES}")
    return [_one_prompt(item, where) for item, where in one_or_several(value, limit=MAX_PROMPTS, noun="prompt")]


def _one_prompt(item: Any, where: str) -> Prompt:
    if isinstance(item, dict):
        if item.get("multimodal_data") is not None:
            raise unreadable(f"{where}multimodal_data")
        if "prompt_string" not in item:
            raise ValueError(f"{where}an object prompt needs 'prompt_string' (text, or token ids and text)")
        item = item["prompt_string"]
    pieces = [item] if isinstance(item, str) else item
    if not isinstance(pieces, list) or not all(is_token_id(piece) or isinstance(piece, str) for piece in pieces):
        raise ValueError(f"{where}each prompt must be {_SHAPES.split(', or a list')[0]}")
    if not any(is_token_id(piece) or piece for piece in pieces):
        raise ValueError(f"{where}the prompt must not be empty")
    return pieces
