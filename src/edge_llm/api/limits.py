"""Per-request limits set by the operator: prompt length and the max_tokens cap."""

from __future__ import annotations

from edge_llm.api.errors import invalid_request
from edge_llm.config import Settings


def check_prompt_tokens(settings: Settings, prompt_tokens: int) -> None:
    """A prompt over --max-prompt-tokens is refused before any decoding."""
    limit = settings.max_prompt_tokens
    if limit is not None and prompt_tokens > limit:
        raise invalid_request(
            f"The prompt has {prompt_tokens} tokens; this server accepts at most {limit} prompt tokens",
            param="messages",
            code="context_length_exceeded",
        )


def cap_max_tokens(settings: Settings, requested: int) -> int:
    """A request asking for more than --max-tokens-cap gets the cap (and finish_reason "length")."""
    cap = settings.max_tokens_cap
    return min(requested, cap) if cap is not None else requested
