"""The bodies of /tokenize and /detokenize (llama-server's shapes). Errors use the server's one error envelope."""

from __future__ import annotations

from edge_llm.api.protocol.common import RequestModel


class TokenizeRequest(RequestModel):
    model: str | None = None
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False  # each token as {"id", "piece"}: its text, or its bytes when they are not UTF-8


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]
