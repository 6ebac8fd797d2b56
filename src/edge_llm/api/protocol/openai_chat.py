"""OpenAI's chat completion body (`POST /v1/chat/completions`): messages, content parts, tools, response formats;
and the minimal `{"prompt": ...}` body the same route takes."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from edge_llm.api.protocol.common import RequestModel, SamplingDefaults, UnreadablePart
from edge_llm.api.protocol.openai import MAX_TOP_LOGPROBS, GenerationFields
from edge_llm.engine.types import SamplingParams


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


class MediaContentPart(UnreadablePart):
    """An image, audio or file part: known, and refused with the reason (the models here read text only)."""

    type: Literal["image_url", "input_audio", "file", "video_url"]


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


class ChatCompletionRequest(GenerationFields):
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
