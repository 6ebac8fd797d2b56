"""The base of every request body: unknown fields are refused (a 400 that names them), not silently ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
