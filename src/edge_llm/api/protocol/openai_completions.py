"""OpenAI's legacy text completion body (`POST /v1/completions`): a raw prompt, no chat template."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from edge_llm.api.protocol.common import SamplingDefaults
from edge_llm.api.protocol.openai import MAX_CHOICES, MAX_TOP_LOGPROBS, GenerationFields


class CompletionRequest(GenerationFields):
    """The legacy text completion: the prompt is raw text, no chat template."""

    prompt: str | list[str] = Field(min_length=1)
    suffix: str | None = None  # text after the insertion point: fill-in-the-middle with the model's FIM tokens
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)

    @field_validator("prompt")
    @classmethod
    def _prompts_not_empty(cls, value: str | list[str]) -> str | list[str]:
        prompts = [value] if isinstance(value, str) else value
        if any(not p for p in prompts):
            raise ValueError("prompts must not be empty")
        if len(prompts) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} prompts per request")
        return value

    @model_validator(mode="after")
    def _check_unsupported(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if len(self.prompts) * self.n > MAX_CHOICES:
            raise ValueError(f"prompts × n must be at most {MAX_CHOICES}")
        return self

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int | None:
        if self.max_tokens:
            return self.max_tokens
        if self.n_predict is not None:
            return self.native_max_tokens()  # n_predict -1: until the answer ends or the context is full
        return defaults.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs if self.logprobs is not None else self.n_probs
