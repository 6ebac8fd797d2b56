"""llama-server's dialect: its `/infill` request, as editor plugins (llama.vscode, llama.vim) send it, and the
native fields its clients also send in OpenAI bodies (`LlamaServerFields`).

The plugins send llama-server's whole parameter set (`samplers`, `id_slot`, …): fields this server does not
know are ignored and named in the `X-Edge-LLM-Ignored-Fields` header, as for every body (api/params.py).
Errors use OpenAI's envelope (protocol/errors.py), as llama-server does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from edge_llm.api.protocol.common import MAX_STOP_STRINGS, RequestModel, SamplingDefaults
from edge_llm.engine.types import SamplingParams

MAX_EXTRA_FILES = 64


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
    response_fields: list[str] | None = Field(None, max_length=64)
    return_progress: bool = False  # a stream also sends `prompt_progress` chunks while the prompt is computed
    return_tokens: bool = False  # the token ids in `tokens`: each chunk's, and all of them in a whole answer
    n_probs: int = Field(0, ge=0, le=20)  # `completion_probabilities`: each token's logprob and the n likeliest
    post_sampling_probs: bool = False  # `prob` / `top_probs` (probabilities) instead of `logprob` / `top_logprobs`
    input_suffix: str = ""  # /infill's text after the cursor; a completion has none

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


class InfillRequest(NativeGeneration):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = Field(default_factory=list, max_length=MAX_EXTRA_FILES)
    prompt: str = ""  # text placed after the prefix, at the cursor (llama.vim sends the typed part of the line)


class NativeCompletionRequest(NativeGeneration):
    """llama-server's POST /completion: a raw prompt (text, token ids, or both mixed), no chat template."""

    prompt: str | list[int | str] = Field(min_length=1)
    grammar: str | None = Field(None, min_length=1)
    json_schema: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: str | list[int | str]) -> str | list[int | str]:
        if isinstance(value, str) and not value:
            raise ValueError("the prompt must not be empty")
        return value
