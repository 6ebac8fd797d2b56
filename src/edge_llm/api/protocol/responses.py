"""The Responses API body (`POST /v1/responses`) and its translation into the chat request it amounts to.

The conversation comes in `input` (messages, function calls and their outputs), after the items of the stored
response `previous_response_id` names (api/response_store.py); it becomes chat messages for the model's template;
tools, `tool_choice` and `text.format` become the chat request's tools, tool choice and response format, so the
chat path's grammars and tool-call parser serve both.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, field_validator, model_validator

from edge_llm.api.protocol.common import RequestModel, set_aside, unreadable
from edge_llm.api.protocol.openai_chat import ChatMessage, FunctionCall, ToolCall

TEXT_PART_TYPES = ("input_text", "output_text", "text")


class _Item(RequestModel):
    # Items a client sends back from an earlier response carry their `id` and `status`: known, and unused here.
    id: str | None = None
    status: str | None = None


class TextPart(_Item):
    type: str
    text: str = ""
    annotations: list[Any] | None = None  # on output_text sent back: known, unused
    logprobs: list[Any] | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value in ("input_image", "input_file", "input_audio"):
            raise unreadable(f"content parts of type '{value}'")
        if value not in TEXT_PART_TYPES:
            raise ValueError(f"content parts of type '{value}' are not supported; this server reads text only "
                             f"({', '.join(TEXT_PART_TYPES)})")
        return value


def _text_or_parts(value: Any) -> str:
    return "text" if isinstance(value, str) else "parts"


# A string or text parts; a discriminator so that an error names what is wrong with the parts.
Content = Annotated[Annotated[str, Tag("text")] | Annotated[list[TextPart], Tag("parts")],
                    Discriminator(_text_or_parts)]


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content

    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Content

    def text(self) -> str:
        return _joined(self.output)


def _item_type(item: Any) -> str | None:
    """A message item may leave its `type` out."""
    return item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)


class ReasoningItem(_Item):
    """An earlier answer's reasoning, sent back by clients that chain turns (Codex): a model that does not reason
    has no use for it, and it is left out of the prompt."""

    type: Literal["reasoning"]
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


def set_aside_unread(body: dict[str, Any]) -> list[str]:
    """Takes out of a raw body what this server cannot use but a client may well send, and returns its paths (to be
    reported as ignored): input items of other tools' calls and outputs (web_search_call, local_shell_call, …: their
    tools are not served here) and tools other than functions (Codex declares `namespace` and `web_search`)."""
    return set_aside(body, "input", _is_unserved_item) + set_aside(body, "tools", _is_unserved_tool)


def _is_unserved_item(item: Any) -> bool:
    kind = _item_type(item) if isinstance(item, dict) else None
    return isinstance(kind, str) and kind not in ITEM_TYPES


def _is_unserved_tool(tool: Any) -> bool:
    kind = tool.get("type") if isinstance(tool, dict) else None
    return isinstance(kind, str) and kind != "function"


class ResponsesTool(RequestModel):
    """A tool as declared; only `function` tools are served (the others are set aside and reported as ignored)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def to_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}

    def echo(self) -> dict[str, Any]:
        """How the Response object lists it."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": self.strict}


class FunctionToolChoice(RequestModel):
    type: Literal["function"]
    name: str


class TextFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format of type json_schema needs a schema")
        return self

    def to_chat(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        schema = {"name": self.name or "response", "schema": self.schema_}
        if self.strict is not None:
            schema["strict"] = self.strict
        return {"type": "json_schema", "json_schema": schema}

    def echo(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class TextConfig(RequestModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, ignored


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: Annotated[Annotated[str, Tag("text")] | Annotated[list[InputItem], Tag("items")],
                     Discriminator(lambda value: "text" if isinstance(value, str) else "items")]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = Field(None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | FunctionToolChoice | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    store: bool | None = None  # None: kept, as OpenAI's default
    # Refused in serving with a message that says why (no Conversations API, no stored prompts).
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None  # run detached (serving/background_responses.py)
    # llama-server's telemetry in a stream: `timings` on each delta, `prompt_progress` on response.in_progress.
    timings_per_token: bool = False
    return_progress: bool = False
    # Accepted and ignored: they do not change the output (there is no reasoning).
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    stream_options: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, value: Any) -> Any:
        """An error that names an item type this server does not read."""
        if not isinstance(value, (str, list)):
            raise ValueError("input must be a string or a list of items")
        if not value:
            raise ValueError("input must not be empty")
        for item in value if isinstance(value, list) else ():
            if not isinstance(item, dict):
                raise ValueError("each input item must be an object")
            kind = _item_type(item)
            if kind not in ITEM_TYPES:
                raise ValueError(f"input items of type '{kind}' are not supported; this server reads "
                                 f"{', '.join(ITEM_TYPES)} items")
        return value

    @property
    def items(self) -> list[InputItem]:
        return [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

    def continued(self, context: list[dict[str, Any]]) -> ResponsesRequest:
        """This request with the items of the turns it continues (a stored response's input and output) first."""
        return self.model_copy(update={"input": [*_ITEMS.validate_python(context), *self.items]})

    @property
    def format(self) -> TextFormat:
        return self.text.format if self.text and self.text.format else TextFormat(type="text")

    def chat_messages(self) -> list[ChatMessage]:
        """`instructions` as the first system message, then the items in order: consecutive function calls join
        the assistant message before them, each function output is a `tool` message."""
        messages = [ChatMessage(role="system", content=self.instructions)] if self.instructions else []
        for item in self.items:
            if isinstance(item, MessageItem):
                messages.append(ChatMessage(role=item.role, content=item.text()))
            elif isinstance(item, FunctionCallItem):
                call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
                last = messages[-1] if messages else None
                if last is not None and last.role == "assistant":
                    last.tool_calls = [*(last.tool_calls or []), call]
                else:
                    messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            elif isinstance(item, FunctionCallOutputItem):
                messages.append(ChatMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
        return messages

    def to_chat(self) -> dict[str, Any]:
        """The chat completion body this request amounts to (validated as ChatCompletionRequest in serving)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [message.model_dump(exclude_none=True) for message in self.chat_messages()],
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "response_format": self.format.to_chat(),
        }
        if self.tools:
            body["tools"] = [tool.to_chat() for tool in self.tools]
        if isinstance(self.tool_choice, FunctionToolChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return body

    def echo(self, *, stored: bool) -> dict[str, Any]:
        """The request's settings as the Response object repeats them; `stored`: whether the response is kept."""
        tool_choice = self.tool_choice or "auto"
        return {
            "instructions": self.instructions,
            "tools": [tool.echo() for tool in self.tools or []],
            "tool_choice": tool_choice.model_dump() if isinstance(tool_choice, FunctionToolChoice) else tool_choice,
            "text": {"format": self.format.echo()},
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_output_tokens": self.max_output_tokens,
            "parallel_tool_calls": True if self.parallel_tool_calls is None else self.parallel_tool_calls,
            "metadata": self.metadata or {},
            "store": stored,
            "previous_response_id": self.previous_response_id,
            "user": self.user,
        }


_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])

__all__ = ["FunctionCallItem", "FunctionCallOutputItem", "MessageItem", "ReasoningItem", "ResponsesRequest",
           "ResponsesTool", "TextFormat", "set_aside_unread"]
