"""Wire protocol: pydantic models for requests and responses, and the one error envelope."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_llm.engine.types import SamplingParams

# ---- errors --------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


# ---- requests ------------------------------------------------------------------------------


class SamplingDefaults(BaseModel):
    temperature: float
    top_p: float
    max_tokens: int


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimplePromptRequest(_Strict):
    """The minimal body: `{"prompt", "temperature", "top_p", "max_tokens"}`; answered as plain-text SSE."""

    prompt: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must not be empty")
        return value

    def to_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.prompt}]

    def sampling_params(self, defaults: SamplingDefaults) -> SamplingParams:
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
        )

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int:
        return self.max_tokens or defaults.max_tokens


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def to_template(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text()}


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="Only n=1 is supported for now.")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    # Accepted and ignored: they do not change the output.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def to_messages(self) -> list[dict[str, Any]]:
        return [message.to_template() for message in self.messages]

    def sampling_params(self, defaults: SamplingDefaults) -> SamplingParams:
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repeat_penalty=self.repeat_penalty or 1.0,
        )

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int:
        return self.max_completion_tokens or self.max_tokens or defaults.max_tokens


# ---- responses -----------------------------------------------------------------------------


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class Timings(BaseModel):
    """Extra field `timings` (not in OpenAI's schema): where the request's time went, in milliseconds."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    timings: Timings | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    timings: Timings | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "edge-llm"
    meta: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
