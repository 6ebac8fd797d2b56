"""The base of every request body and of every object inside one; the server's sampling defaults that fill what a
body leaves out.

Clients written for other servers, SDKs and frameworks add keys this server does not know, at any depth (an
assistant message echoed back with `annotations` and `refusal`, a content part with `cache_control`, llama.vscode's
`input_extra` chunks with `time`). Such keys are kept aside while the body is validated (`extra="allow"`), then
reported with their dotted paths and dropped (`api/params.py`); `--strict-params` refuses them instead.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class SamplingDefaults(BaseModel):
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
