"""Ollama's model-management wire (its api/types.go): /api/tags, /api/show, /api/ps, /api/pull, /api/delete,
/api/copy, /api/version. Field names and shapes are Ollama's; keys Ollama omits when empty (`omitempty`) are left
out of the answers (`ollama_json`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from edge_llm.api.protocol.common import RequestModel


class ShowRequest(RequestModel):
    model: str = ""
    name: str = ""  # Ollama's older spelling of `model`
    verbose: bool = False  # the long arrays of model_info (tokens, merges) in full
    system: str = ""  # accepted and ignored, as the modelfile's SYSTEM would be shown
    template: str = ""  # deprecated in Ollama
    options: dict[str, Any] | None = None


class PullRequest(RequestModel):
    model: str = ""
    name: str = ""
    insecure: bool = False  # ignored: the catalogue is fetched from PyPI over HTTPS
    stream: bool | None = None  # default true: NDJSON status lines
    username: str = ""  # ignored, as Ollama ignores them
    password: str = ""


class PushRequest(PullRequest):
    pass


class CreateRequest(RequestModel):
    model: str = ""
    name: str = ""
    stream: bool | None = None


class DeleteRequest(RequestModel):
    model: str = ""
    name: str = ""


class CopyRequest(RequestModel):
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)


class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str = "gguf"
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""


class ListModel(BaseModel):
    name: str
    model: str
    modified_at: str  # RFC 3339 with the local offset, as Go writes a time.Time
    size: int  # bytes on disk
    digest: str  # sha256 of the GGUF file, 64 hex digits
    details: ModelDetails


class ListResponse(BaseModel):
    models: list[ListModel]


class ProcessModel(BaseModel):
    name: str
    model: str
    size: int  # bytes of memory the loaded model takes (its estimate: weights, KV cache, compute)
    digest: str
    details: ModelDetails
    expires_at: str  # when keep_alive unloads it; far in the future for a model never unloaded
    size_vram: int = 0  # CPU only
    context_length: int


class ProcessResponse(BaseModel):
    models: list[ProcessModel]


class ShowResponse(BaseModel):
    license: str = ""
    modelfile: str = ""
    parameters: str = ""
    template: str = ""
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str] = Field(default_factory=list)
    modified_at: str = ""


class ProgressResponse(BaseModel):
    status: str
    digest: str = ""
    total: int = 0
    completed: int = 0


class VersionResponse(BaseModel):
    version: str


_OMIT_EMPTY = {"license", "modelfile", "parameters", "template", "capabilities", "modified_at", "digest", "total",
               "completed"}


def ollama_json(answer: BaseModel) -> dict[str, Any]:
    """The answer as Ollama writes it: its `omitempty` keys left out when empty."""
    return {key: value for key, value in answer.model_dump().items()
            if key not in _OMIT_EMPTY or value not in ("", 0, [], None)}
