"""Anthropic's Messages API on the wire: the request bodies of /v1/messages and /v1/messages/count_tokens, their
conversion to the chat-template messages every chat family renders (the answers and stream events:
protocol/anthropic_answers.py; the error envelope: protocol/errors.py).

What a text model can use is read: text, tool_use and tool_result blocks, client tools with an input_schema, system
turns inside `messages` (Claude Code sends one). `thinking` / `redacted_thinking` blocks sent back from an earlier
answer are accepted and left out of the prompt; image and document blocks are a 400 saying the model reads text
only; Anthropic's server tools (typed tools without an input_schema: web search, bash, text editor, …) are set
aside and reported as ignored. `cache_control` on any block or tool is accepted and changes nothing: the prefix
cache reuses every shared prefix by itself.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from edge_llm.api.protocol.common import (MAX_STOP_STRINGS, RequestModel, SamplingDefaults, UnreadablePart,
                                          set_aside)
from edge_llm.engine.types import SamplingParams

MAX_TOOLS = 128


# ---- content blocks --------------------------------------------------------------------------


class AnthropicTextBlock(RequestModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # ignored
    citations: list[dict[str, Any]] | None = None  # ignored


class AnthropicToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class AnthropicToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[AnthropicTextBlock] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(block.text for block in self.content)
        return f"Error: {body}" if self.is_error else body


class AnthropicThinkingBlock(RequestModel):
    """An earlier answer's thinking, sent back as Anthropic's API requires: left out of the prompt."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking's


class AnthropicMediaBlock(UnreadablePart):
    """An image or a document: known, and refused with the reason (the models here read text only)."""

    label = "{kind} blocks"
    type: Literal["image", "document"]


AnthropicContentBlock = Annotated[AnthropicTextBlock | AnthropicToolUseBlock | AnthropicToolResultBlock
                                  | AnthropicThinkingBlock | AnthropicMediaBlock, Field(discriminator="type")]


class AnthropicMessage(RequestModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[AnthropicContentBlock]

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> AnthropicMessage:
        if isinstance(self.content, list):
            wrong = "tool_result" if self.role == "assistant" else "tool_use"
            if any(block.type == wrong for block in self.content):
                raise ValueError(f"a {self.role} message cannot hold {wrong} blocks")
        return self

    def to_chat(self) -> list[dict[str, Any]]:
        """This message as chat-template messages (OpenAI's shape, which the templates know)."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "system":
            return [{"role": "system", "content": "".join(
                block.text for block in self.content if isinstance(block, AnthropicTextBlock))}]
        if self.role == "assistant":  # thinking blocks are left out
            message: dict[str, Any] = {"role": "assistant", "content": "".join(
                block.text for block in self.content if isinstance(block, AnthropicTextBlock))}
            calls = [block for block in self.content if isinstance(block, AnthropicToolUseBlock)]
            if calls:
                # Templates render arguments with `tojson`: they get the object itself.
                message["tool_calls"] = [{"id": call.id, "type": "function",
                                          "function": {"name": call.name, "arguments": call.input}}
                                         for call in calls]
            return [message]
        # A user turn: each tool_result is a tool message, the text between them a user message, in order.
        out: list[dict[str, Any]] = []
        text: list[str] = []
        for block in self.content:
            if isinstance(block, AnthropicToolResultBlock):
                if text:
                    out.append({"role": "user", "content": "".join(text)})
                    text = []
                out.append({"role": "tool", "content": block.text(), "tool_call_id": block.tool_use_id})
            elif isinstance(block, AnthropicTextBlock):
                text.append(block.text)
        if text or not out:
            out.append({"role": "user", "content": "".join(text)})
        return out


# ---- tools -----------------------------------------------------------------------------------


class AnthropicTool(RequestModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None

    def to_openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


def set_aside_server_tools(body: dict[str, Any]) -> list[str]:
    """Takes Anthropic's server tools (a `type` other than "custom" and no input_schema: web_search_20250305,
    bash_20250124, text_editor_…, code_execution_…) out of a raw body and returns their paths, to be reported as
    ignored: they run on Anthropic's side, and this server has none of them."""
    return set_aside(body, "tools", _is_server_tool)


def _is_server_tool(tool: Any) -> bool:
    kind = tool.get("type") if isinstance(tool, dict) else None
    return isinstance(kind, str) and kind != "custom" and "input_schema" not in tool


class AnthropicToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None  # one call per answer is all the grammar makes anyway

    @model_validator(mode="after")
    def _name_with_tool(self) -> AnthropicToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice needs a name exactly when its type is 'tool'")
        return self


class AnthropicJsonFormat(RequestModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(RequestModel):
    format: AnthropicJsonFormat | None = None  # structured output: the answer follows the schema (a grammar)
    effort: str | None = None  # ignored


# ---- requests --------------------------------------------------------------------------------


class CountTokensRequest(RequestModel):
    """What makes the prompt: the body of /v1/messages/count_tokens, and the first half of /v1/messages."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicTextBlock] | None = None
    tools: list[AnthropicTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = None  # ignored: the answer has no thinking blocks

    @model_validator(mode="after")
    def _check_conversation(self) -> CountTokensRequest:
        last = self.messages[-1]
        if last.role == "assistant":  # a prefill: the answer continues its text
            if not isinstance(last.content, str) and any(block.type not in ("text", "thinking", "redacted_thinking")
                                                         for block in last.content):
                raise ValueError("a final assistant message (a prefill) can hold only text")
            text = last.to_chat()[0]["content"]
            if not text or text != text.rstrip():
                raise ValueError("a final assistant message (a prefill) needs text that does not end in whitespace")
        if self.tool_choice is not None and self.tool_choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f"tool_choice '{self.tool_choice.type}' needs tools")
        if self.tool_choice is not None and self.tool_choice.type == "tool":
            if self.tool_choice.name not in {tool.name for tool in self.tools or []}:
                raise ValueError(f"tool_choice names '{self.tool_choice.name}', which is not in tools")
        return self

    @property
    def continues_final(self) -> bool:
        """The last message is the assistant's: the answer continues it (Anthropic's prefill)."""
        return self.messages[-1].role == "assistant"

    @property
    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n\n".join(block.text for block in self.system) or None

    def to_chat_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system_text is not None:
            messages.append({"role": "system", "content": self.system_text})
        for message in self.messages:
            messages.extend(message.to_chat())
        return messages

    @property
    def active_tools(self) -> list[AnthropicTool]:
        """The tools the prompt shows the model: none for tool_choice 'none', as OpenAI's 'none' does here."""
        if self.tool_choice is not None and self.tool_choice.type == "none":
            return []
        return list(self.tools or [])

    def openai_tools(self) -> list[dict[str, Any]] | None:
        return [tool.to_openai() for tool in self.active_tools] or None

    def forced_functions(self) -> list[dict[str, Any]] | None:
        """The functions a grammar must make the answer call: all for 'any', one for 'tool'; None for free text."""
        choice = self.tool_choice
        if choice is None or choice.type not in ("any", "tool"):
            return None
        tools = [t for t in self.active_tools if choice.type == "any" or t.name == choice.name]
        return [tool.to_openai()["function"] for tool in tools]


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1000)
    output_config: AnthropicOutputConfig | None = None
    # Accepted and ignored: they do not change the answer.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _one_grammar(self) -> MessagesRequest:
        if self.output_schema is not None and self.forced_functions() is not None:
            raise ValueError("output_config.format cannot be combined with a forced tool call (tool_choice any/tool)")
        return self

    @property
    def output_schema(self) -> dict[str, Any] | None:
        config = self.output_config
        return None if config is None or config.format is None else config.format.schema_

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not stop for stop in value):
            raise ValueError("stop sequences must not be empty")
        return value

    def sampling_params(self, defaults: SamplingDefaults, grammar: str | None) -> SamplingParams:
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            grammar=grammar,
        )
