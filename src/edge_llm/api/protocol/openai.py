"""What OpenAI's generation bodies share: chat completions and text completions (llama-server's native fields
included), their sampling and limits."""

from __future__ import annotations

from pydantic import Field, field_validator

from edge_llm.api.protocol.common import MAX_STOP_STRINGS, RequestModel, SamplingDefaults
from edge_llm.api.protocol.llama_server import LlamaServerFields
from edge_llm.engine.types import SamplingParams


class StreamOptions(RequestModel):
    include_usage: bool = False


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


class GenerationFields(RequestModel, LlamaServerFields):
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
