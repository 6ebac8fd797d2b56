"""Ollama's generation API on the wire (docs/api.md and api/types.go of ollama/ollama): the bodies of /api/chat,
/api/generate, /api/embed and /api/embeddings, the `options` object, and their conversion to what the engine takes.

Ollama's Go types turn JSON nulls into zero values, so every field here takes null for "not given" (Zed sends
`"system": null`, LangChain `"images": []`). `keep_alive` is read by the model router (api/model_routing.py).

`options`: the sampling options and `num_ctx` are honoured; every other option Ollama knows (runner and GPU
settings, mirostat, typical_p, …) is accepted and named in the X-Edge-LLM-Ignored-Fields header, and so is an option
it does not know (which `--strict-params` refuses).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from edge_llm.api.protocol.common import MAX_STOP_STRINGS, RequestModel, SamplingDefaults
from edge_llm.api.protocol.llama_server import native_sampling
from edge_llm.api.protocol.openai_chat import ToolDefinition
from edge_llm.engine.types import SamplingParams

THINK_LEVELS = ("high", "medium", "low", "max")
MAX_TOOLS = 128
JSON_FORMAT_SCHEMA: dict[str, Any] = {"type": "object"}  # format "json": a JSON object, as llama.cpp's json.gbnf
REPEAT_LAST_N = 64  # the tokens the repeat penalties look back over (engine/llama/sampling.py), Ollama's default


class OllamaOptions(RequestModel):
    # Honoured.
    num_predict: int | None = None  # > 0: the most tokens to generate; -1, -2, 0: until the answer ends
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # -1: a random seed
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: list[str] | str | None = None
    num_ctx: int | None = Field(None, ge=1)  # the request's context window, within the server's --ctx-size
    repeat_last_n: int | None = None  # honoured at 64 (the engine's window, and Ollama's default), else ignored
    # Accepted and ignored (named in X-Edge-LLM-Ignored-Fields when given): the engine's own settings decide.
    num_keep: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    num_gqa: int | None = None
    rope_frequency_base: float | None = None
    rope_frequency_scale: float | None = None
    draft_num_predict: int | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: list[str] | str | None) -> list[str] | str | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed")
        if any(not stop for stop in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    def ignored(self, *, embedding: bool = False) -> list[str]:
        """The given options that change nothing here, as `options.<name>` paths (for embeddings: all but num_ctx)."""
        honoured = {"num_ctx"} if embedding else _SAMPLING_OPTIONS
        names = [name for name in type(self).model_fields
                 if getattr(self, name) is not None and name not in honoured]
        if not embedding and self.repeat_last_n == REPEAT_LAST_N:
            names.remove("repeat_last_n")
        return ["options." + name for name in names]

    @property
    def max_tokens(self) -> int | None:
        return self.num_predict if self.num_predict is not None and self.num_predict > 0 else None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling_params(self, defaults: SamplingDefaults, grammar: str | None) -> SamplingParams:
        """The server's defaults (--temperature, --top-p, --top-k) where the request gives no option."""
        return native_sampling(defaults, self, grammar)


_SAMPLING_OPTIONS = frozenset({"num_predict", "temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty",
                               "presence_penalty", "frequency_penalty", "stop", "num_ctx"})


# ---- messages ----------------------------------------------------------------------------------------------------


class OllamaToolCallFunction(RequestModel):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str | None = None  # an object (Ollama); a JSON text is taken too
    index: int | None = None


class OllamaToolCall(RequestModel):
    id: str | None = None
    type: str | None = None
    function: OllamaToolCallFunction


class OllamaMessage(RequestModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None  # an earlier answer's thinking: a model that does not think has no use for it
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _lower_role(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # as Ollama's Message.UnmarshalJSON does

    def to_template(self, position: int) -> dict[str, Any]:
        """This message in the shape the chat templates know (OpenAI's), with tool-call arguments as objects."""
        message: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id or f"call_{position}_{number}", "type": "function",
                 "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)}}
                for number, call in enumerate(self.tool_calls)
            ]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_name:
            message["name"] = self.tool_name
        return message


def _arguments(arguments: dict[str, Any] | str | None) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments or {}


# ---- requests ----------------------------------------------------------------------------------------------------


class _GenerationFields(RequestModel):
    """What /api/chat and /api/generate share."""

    model: str | None = None
    stream: bool | None = None  # Ollama streams unless told `false`
    format: dict[str, Any] | str | None = None  # "json", or a JSON schema
    options: OllamaOptions | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    truncate: bool | None = None  # true (Ollama's default) drops old messages to fit; here a prompt must fit (400)
    shift: bool | None = None  # true (Ollama's default) shifts a full context; here the answer ends ("length")

    @field_validator("format")
    @classmethod
    def _check_format(cls, value: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        if isinstance(value, str) and value not in ("", "json"):
            raise ValueError(f'invalid format: {json.dumps(value)}; expected "json" or a valid JSON Schema object')
        return value

    @field_validator("think")
    @classmethod
    def _check_think(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and value not in THINK_LEVELS:
            raise ValueError(f'invalid think value: {json.dumps(value)} (must be "high", "medium", "low", "max", '
                             "true, or false)")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _check_top_logprobs(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 20:
            raise ValueError("top_logprobs must be between 0 and 20")
        return value

    @property
    def streams(self) -> bool:
        return self.stream is not False

    @property
    def thinks(self) -> bool:
        """Whether thinking was asked for (true or a level), as Ollama's ThinkValue.Bool()."""
        return self.think is True or isinstance(self.think, str)

    @property
    def format_schema(self) -> dict[str, Any] | None:
        """The schema the answer must follow: None for no format ("" or null, as Ollama)."""
        if isinstance(self.format, dict):
            return self.format
        return JSON_FORMAT_SCHEMA if self.format == "json" else None

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def sampling(self) -> OllamaOptions:
        return self.options or OllamaOptions()

    def ignored(self) -> list[str]:
        """What this request asks for that is not done here: options, and truncate / shift set to true."""
        return self.sampling.ignored() + [name for name in ("truncate", "shift") if getattr(self, name) is True]


class OllamaChatRequest(_GenerationFields):
    messages: list[OllamaMessage] | None = None  # none: the model is loaded (or unloaded with keep_alive 0)
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)

    def to_messages(self) -> list[dict[str, Any]]:
        return [message.to_template(position) for position, message in enumerate(self.messages or [])]

    @property
    def image_path(self) -> str | None:
        """Where the first image is, e.g. `messages.0.images`."""
        for position, message in enumerate(self.messages or []):
            if message.images:
                return f"messages.{position}.images"
        return None


class OllamaGenerateRequest(_GenerationFields):
    prompt: str | None = None  # empty: the model is loaded (or unloaded with keep_alive 0)
    suffix: str | None = None  # the text after the cursor: fill-in-the-middle with the model's FIM tokens
    system: str | None = None
    template: str | None = None  # a Go template in Ollama; the model's own chat template is used here
    context: list[int] | None = None  # an earlier answer's `context`: its tokens come before this prompt
    raw: bool | None = None
    images: list[str] | None = None

    @property
    def image_path(self) -> str | None:
        return "images" if self.images else None


class OllamaEmbedRequest(RequestModel):
    model: str | None = None
    input: str | list[str] | None = None
    truncate: bool | None = None  # default true: an input longer than the context is cut to fit; false: a 400
    dimensions: int | None = Field(None, ge=1)
    options: OllamaOptions | None = None

    @property
    def texts(self) -> list[str]:
        """Ollama embeds nothing for an empty string (the request only loads the model)."""
        if isinstance(self.input, str):
            return [self.input] if self.input else []
        return list(self.input or [])


class OllamaEmbeddingsRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    options: OllamaOptions | None = None


# ---- responses (for the OpenAPI document; the answers are built as dicts) -------------------------------------------


class _OllamaFinal(BaseModel):
    """What every generation answer's last object carries: done, why, and Ollama's figures (durations in ns)."""

    model: str
    created_at: str
    done: bool
    done_reason: str | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class OllamaChatResponse(_OllamaFinal):
    message: dict[str, Any]


class OllamaGenerateResponse(_OllamaFinal):
    response: str
    context: list[int] | None = None


class OllamaEmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None


class OllamaEmbeddingsResponse(BaseModel):
    embedding: list[float]
