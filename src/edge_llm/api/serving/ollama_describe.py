"""A served model as Ollama describes one (pure): `details`, `model_info`, `capabilities`, `parameters`,
`modelfile`, and times as Go writes them. The facts come from the GGUF header (models/gguf_info.py), never from
loading the model."""

from __future__ import annotations

import json
import struct
from datetime import datetime, timedelta, timezone
from typing import Any

from edge_llm.api.protocol.ollama_models import ModelDetails
from edge_llm.config import Settings
from edge_llm.models.gguf_info import ArrayValue, ModelFacts

_HIDDEN_KEYS = ("general.name", "tokenizer.chat_template")  # Ollama leaves these out of model_info
_SHORT_ARRAY = 5  # Ollama empties longer arrays unless `verbose`
_PARAMETER_WIDTH = 30
_NEVER = timedelta(microseconds=(2**63 - 1) // 1000)  # Go's time.Now().Add(math.MaxInt64): "Forever" in `ollama ps`


def human_number(n: int) -> str:
    """Ollama's format.HumanNumber: 494032768 → "494.03M", 7_000_000_000 → "7B"."""
    for limit, suffix, decimals in ((10**9, "B", 1), (10**6, "M", 2)):
        if n >= limit:
            value = n / limit
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.{decimals}f}{suffix}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def details(architecture: str, parameter_count: int, quantization: str) -> ModelDetails:
    return ModelDetails(family=architecture, families=[architecture], parameter_size=human_number(parameter_count),
                        quantization_level=quantization)


def go_time(moment: datetime) -> str:
    """A time as Go's JSON writes one (RFC 3339, nanosecond digits without trailing zeros, Z for UTC)."""
    local = moment.astimezone()
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if local.microsecond:
        text += f".{local.microsecond:06d}".rstrip("0")
    offset = local.utcoffset() or timedelta(0)
    if not offset:
        return text + "Z"
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def file_time(mtime_ns: int) -> str:
    return go_time(datetime.fromtimestamp(mtime_ns / 1e9, tz=timezone.utc))


def expiry(seconds_left: float | None) -> str:
    """`expires_at` of a loaded model: now + what keep_alive leaves it; None: never unloaded."""
    now = datetime.now(timezone.utc)
    return go_time(now + (_NEVER if seconds_left is None else timedelta(seconds=max(seconds_left, 0.0))))


def model_info(facts: ModelFacts, *, verbose: bool) -> dict[str, Any]:
    """The header's keys and values, as Ollama's /api/show lists them."""
    info: dict[str, Any] = {}
    for key, value in facts.metadata.items():
        if key in _HIDDEN_KEYS:
            continue
        info[key] = _value(value, verbose)
    info["general.parameter_count"] = facts.parameter_count  # Ollama adds it, counted from the tensors
    return dict(sorted(info.items()))


def _value(value: Any, verbose: bool) -> Any:
    if isinstance(value, ArrayValue):
        if value.items is None or (not verbose and value.length > _SHORT_ARRAY):
            return []
        return [_value(item, verbose) for item in value.items]
    if isinstance(value, float):
        return _float32_shortest(value)
    return value


def _float32_shortest(value: float) -> float:
    """A float32 header value as Go prints a float32 (1e-06, not 9.999999974752427e-07)."""
    try:
        if struct.unpack("<f", struct.pack("<f", value))[0] != value:
            return value  # a float64 value: kept as it is
    except OverflowError:
        return value
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", candidate))[0] == value:
            return candidate
    return value


def capabilities(facts: ModelFacts, has_fim: bool) -> list[str]:
    """Ollama's rules on a GGUF (server/images.go): `embedding` for a model with a pooling type, else
    `completion`; `tools` when the chat template mentions tools; `insert` with fill-in-the-middle tokens (Ollama
    reads it from its template's `.Suffix`; here it is what /api/generate's `suffix` needs). Never `vision` or
    `thinking`: no model served here takes images or thinks apart from its answer."""
    pooling = facts.metadata.get(f"{facts.architecture}.pooling_type")
    found = ["embedding" if pooling is not None else "completion"]
    template = facts.metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and ("tools" in template or "tool_call" in template):
        found.append("tools")
    if has_fim:
        found.append("insert")
    return found


def template(facts: ModelFacts, fim: tuple[str, str, str] | None) -> str:
    """The model's chat template; for a model with fill-in-the-middle tokens, led by the FIM layout in Ollama's
    template language, as Ollama's templates for coder models are: clients decide FIM support by `.Suffix` in it
    (Continue). The chat part stays the GGUF's Jinja text: it is shown, never executed by a client."""
    chat = facts.metadata.get("tokenizer.chat_template")
    chat = chat if isinstance(chat, str) else ""
    if fim is None:
        return chat
    prefix, suffix, middle = fim
    return (f"{{{{- if .Suffix }}}}{prefix}{{{{ .Prompt }}}}{suffix}{{{{ .Suffix }}}}{middle}\n"
            f"{{{{- else }}}}{chat}{{{{- end }}}}")


def parameters(settings: Settings) -> dict[str, Any]:
    """The defaults a request that sets none gets here, by Ollama's option names."""
    values: dict[str, Any] = {"num_ctx": settings.sequence_context, "num_predict": settings.default_max_tokens,
                              "temperature": settings.default_temperature, "top_p": settings.default_top_p}
    if settings.default_top_k:
        values["top_k"] = settings.default_top_k
    return values


def parameters_text(values: dict[str, Any]) -> str:
    """Ollama's `parameters`: `name` padded to 30 columns, then the value as Go's %#v writes it."""
    return "\n".join(f"{name:<{_PARAMETER_WIDTH}} {_go_value(value)}" for name, value in values.items())


def modelfile(name: str, facts: ModelFacts, values: dict[str, Any]) -> str:
    lines = ['# Modelfile generated by "edge-llm" for Ollama\'s /api/show',
             "# To build a new Modelfile based on this, replace FROM with:", f"# FROM {name}", "",
             f"FROM {facts.path}"]
    lines += [f"PARAMETER {key} {_go_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _go_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return f"{value:g}" if value == int(value) else repr(value)
    return str(value)
