"""Wire protocol: pydantic models of the OpenAI requests, and the one error envelope (answers: protocol_answers)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator

from edge_llm.api.protocol_base import RequestModel, SamplingDefaults
from edge_llm.api.protocol_llama import MAX_STOP_STRINGS, LlamaServerFields
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


class SimplePromptRequest(RequestModel):
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
            top_k=defaults.top_k,
        )

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int:
        return self.max_tokens or defaults.max_tokens


class TextContentPart(RequestModel):
    type: Literal["text"]
    text: str


MEDIA_PART_TYPES = ("image_url", "input_audio", "file", "video_url")


class MediaContentPart(RequestModel):
    """An image, audio or file part: known, and refused with the reason (the models here read text only)."""

    type: Literal["image_url", "input_audio", "file", "video_url"]

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        raise ValueError(f"content parts of type '{kind}' cannot be read: this model reads text only (no image, "
                         "audio or file input)")


def _part_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "media" if kind in MEDIA_PART_TYPES else "text"


# A discriminator, so that an image part's error says why instead of naming the text part's fields.
ContentPart = Annotated[Annotated[TextContentPart, Tag("text")] | Annotated[MediaContentPart, Tag("media")],
                        Discriminator(_part_kind)]


class FunctionCall(RequestModel):
    name: str
    arguments: str


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return self

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content if isinstance(part, TextContentPart))
        return self.content or ""

    def to_template(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": _json_or_text(call.function.arguments)}}
                for call in self.tool_calls
            ]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.name:
            message["name"] = self.name
        return message


def _json_or_text(arguments: str) -> Any:
    """Templates render arguments with `tojson`: give them the object, not a JSON string of it."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class StreamOptions(RequestModel):
    include_usage: bool = False


class JsonSchemaFormat(RequestModel):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema")
        return self


class FunctionDefinition(RequestModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDefinition(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


LogitBias = dict[str, float]
MAX_CHOICES = 8  # n above this is refused: each choice is a sequence in the batch
MAX_TOP_LOGPROBS = 20


def check_logit_bias(value: LogitBias | None) -> LogitBias | None:
    for key, bias in (value or {}).items():
        if not key.lstrip("-").isdigit():
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        if not -100 <= bias <= 100:
            raise ValueError(f"logit_bias values must be between -100 and 100, got {bias} for {key}")
    return value


class _GenerationFields(RequestModel, LlamaServerFields):
    """What chat and text completions share (llama-server's native fields included)."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1000)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    logit_bias: LogitBias | None = None
    ignore_eos: bool = False  # llama-server / vLLM extension: generate until max_tokens or a stop string
    speculative: bool = True  # false: no speculative decoding for this request (see --speculative)
    # Accepted and ignored: they do not change the output.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        if value is not None and any(not s for s in ([value] if isinstance(value, str) else value)):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: LogitBias | None) -> LogitBias | None:
        return check_logit_bias(value)

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        # -100 bans a token outright, as in OpenAI's API.
        return tuple((int(k), float("-inf") if v <= -100 else v) for k, v in (self.logit_bias or {}).items())

    def sampling_params(self, defaults: SamplingDefaults, choice: int = 0, grammar: str | None = None
                        ) -> SamplingParams:
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            min_p=self.min_p or 0.0,
            # Each of the n choices gets its own seed, or they would all be the same text.
            seed=None if self.seed is None else (self.seed + choice) & 0xFFFFFFFF,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repeat_penalty=self.repeat_penalty or 1.0,
            logit_bias=self.logit_bias_pairs(),
            ignore_eos=self.ignore_eos,
            grammar=grammar,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_combinations(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {tool.function.name for tool in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names '{self.tool_choice.function.name}', which is not in tools")
        if self.tool_choice in ("required",) and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    def to_messages(self) -> list[dict[str, Any]]:
        return [message.to_template() for message in self.messages]

    def requested_max_tokens(self, defaults: SamplingDefaults) -> int | None:
        """None: none was given, so the answer runs until it ends or the context is full (as OpenAI,
        llama-server and vLLM do); `--default-max-tokens` is for the simple body and completions."""
        return self.max_completion_tokens or self.max_tokens or self.native_max_tokens()

    @property
    def logprob_count(self) -> int | None:
        if self.logprobs:
            return self.top_logprobs or 0
        return self.n_probs

    @property
    def active_tools(self) -> list[ToolDefinition]:
        return [] if self.tool_choice == "none" else list(self.tools or [])


class CompletionRequest(_GenerationFields):
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
