"""OpenAI's legacy text completion body (`POST /v1/completions`): a raw prompt, no chat template."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from edge_llm.api.protocol.common import SamplingDefaults
from edge_llm.api.protocol.llama_server import MAX_PROMPTS, Prompt, split_prompts
from edge_llm.api.protocol.openai import MAX_CHOICES, MAX_TOP_LOGPROBS, GenerationFields


class CompletionRequest(GenerationFields):
    """The legacy text completion: the prompt is raw text, no chat template. `prompt` takes OpenAI's shapes (a
    string, a list of strings, token ids, a list of token-id lists) and, as llama-server's /v1/completions does,
    text and ids mixed; it is read into `prompts` the way /completion reads its prompt (split_prompts)."""

    prompt: Any = Field(description="a string, a list of strings, token ids, or a list of token-id lists")
    suffix: str | None = None  # text after the insertion point: fill-in-the-middle with the model's FIM tokens
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_CHOICES)

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: Any) -> list[Prompt]:
        return split_prompts(value)

    @model_validator(mode="after")
    def _check_unsupported(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of other than n is not supported")
        if len(self.prompts) * self.n > MAX_PROMPTS:
            raise ValueError(f"prompts × n must be at most {MAX_PROMPTS}")
        return self

    @property
    def prompts(self) -> list[Prompt]:
        return self.prompt  # type: ignore[no-any-return]  # split_prompts made it a list of prompts

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int | None:
        if self.max_tokens:
            return self.max_tokens
        if self.n_predict is not None:
            return self.native_max_tokens()  # n_predict -1: until the answer ends or the context is full
        return defaults.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs if self.logprobs is not None else self.n_probs
