"""Raw prompts (no chat template) as token ids, read as llama-server's `tokenize_mixed` reads them: pieces of text
and token ids, in order. One reading for every raw-prompt route: /completion and /v1/completions."""

from __future__ import annotations

from edge_llm.api.protocol.llama_server import Prompt
from edge_llm.api.request_context import RequestContext
from edge_llm.api.serving.base import Serving


def prompt_tokens(serving: Serving, pieces: Prompt, param: str) -> list[int]:
    """Text pieces with their control-token spellings read as the tokens (the caller's intent on a raw route), the
    model's BOS before a prompt that starts with text; token ids checked against the vocabulary (a 400 naming
    `{param}{position}`), so none reaches llama.cpp. Runs in the tokenizer thread."""
    serving.check_prompt_bytes(sum(len(piece.encode("utf-8", errors="replace")) for piece in pieces
                                   if isinstance(piece, str)))
    tokens: list[int] = []
    for index, piece in enumerate(pieces):
        if isinstance(piece, str):
            tokens.extend(serving.engine.tokenize(piece, add_special=index == 0, parse_special=True))
        else:
            serving.check_token_ids([piece], f"{param}{index}")
            tokens.append(piece)
    return tokens


def _param(prompts: list[Prompt], index: int) -> str:
    """A prompt's body path prefix for its errors: `prompt.` for one prompt, `prompt.N.` for several."""
    return "prompt." if len(prompts) == 1 else f"prompt.{index}."


async def tokenized(serving: Serving, context: RequestContext, prompts: list[Prompt]) -> list[list[int]]:
    """Every prompt's tokens, read off the event loop."""
    return [await serving.off_loop(context, prompt_tokens, serving, pieces, _param(prompts, index))
            for index, pieces in enumerate(prompts)]


async def texts(serving: Serving, context: RequestContext, prompts: list[Prompt],
                tokens: list[list[int]] | None = None) -> list[str]:
    """Every prompt as text (an echo, a prompt shown back, a fill-in-the-middle prefix): the client's string, or
    its tokens' text (`tokens` when the caller has them)."""
    result = []
    for index, pieces in enumerate(prompts):
        if len(pieces) == 1 and isinstance(pieces[0], str):
            result.append(pieces[0])
            continue
        ids = tokens[index] if tokens is not None else \
            await serving.off_loop(context, prompt_tokens, serving, pieces, _param(prompts, index))
        result.append(await serving.off_loop(context, serving.engine.detokenize, ids))
    return result
