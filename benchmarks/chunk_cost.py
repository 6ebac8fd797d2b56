"""The per-chunk cost of writing a stream's wire shapes: the typed encoders of api/protocol/ against the inline dict
literals serving built before them (kept here, verbatim, as the baseline), and a pydantic model's dump for scale.

Each round encodes N chunks of each shape into SSE/NDJSON bytes, as a stream does once per token; rounds alternate
between the variants, and the figure is CPU time (process_time), so other processes on the machine weigh less.
Prints a JSON report of microseconds per chunk and new/old ratios (median over rounds).

    python benchmarks/chunk_cost.py [--chunks 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from edge_llm.api.ndjson import encode_line
from edge_llm.api.protocol import anthropic_answers, ollama_answers, responses_answers
from edge_llm.api.protocol.openai_answers import StreamHead, chat_chunk
from edge_llm.api.sse import encode_json_event

TEXT = " token"
HEAD = StreamHead("chatcmpl-0123456789abcdef0123456789abcdef", 1_700_000_000, "qwen2.5-coder-0.5b-instruct")


# ---- the baseline: what serving wrote inline before the encoders (verbatim shapes) ------------------------

def old_chat(index: int) -> bytes:
    return encode_json_event({
        "id": HEAD.id, "object": "chat.completion.chunk", "created": HEAD.created, "model": HEAD.model,
        "choices": [{"index": 0, "delta": {"content": TEXT}, "logprobs": None, "finish_reason": None}],
    })


def old_responses(index: int) -> bytes:
    event = {"type": "response.output_text.delta", "sequence_number": index, "item_id": "msg_0123", "output_index": 0,
             "content_index": 0, "delta": TEXT, "logprobs": []}
    return encode_json_event(event, event=event["type"])


def old_anthropic(index: int) -> bytes:
    return encode_json_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}},
                             event="content_block_delta")


def old_ollama(index: int) -> bytes:
    answer: dict[str, Any] = {"model": HEAD.model, "created_at": ollama_answers.created_at()}
    answer["message"] = {"role": "assistant", "content": TEXT}
    answer["done"] = False
    return encode_line(answer)


# ---- the typed encoders ------------------------------------------------------------------------------------

def new_chat(index: int) -> bytes:
    return encode_json_event(chat_chunk(HEAD, 0, {"content": TEXT}))


def new_responses(index: int) -> bytes:
    event = responses_answers.text_delta_event(index, "msg_0123", 0, TEXT)
    return encode_json_event(event, event=event["type"])


def new_anthropic(index: int) -> bytes:
    return encode_json_event(anthropic_answers.text_delta(0, TEXT), event="content_block_delta")


def new_ollama(index: int) -> bytes:
    return encode_line(ollama_answers.chat_line(HEAD.model, TEXT, [], False))


# ---- for scale: a pydantic model dumped per chunk ------------------------------------------------------------

class _Delta(BaseModel):
    content: str | None = None


class _Choice(BaseModel):
    index: int
    delta: _Delta
    logprobs: None = None
    finish_reason: str | None = None


class _Chunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[_Choice]


def pydantic_chat(index: int) -> bytes:
    chunk = _Chunk(id=HEAD.id, created=HEAD.created, model=HEAD.model,
                   choices=[_Choice(index=0, delta=_Delta(content=TEXT))])
    return ("data: " + chunk.model_dump_json() + "\n\n").encode("utf-8")


VARIANTS: dict[str, dict[str, Callable[[int], bytes]]] = {
    "chat_chunk": {"old": old_chat, "new": new_chat, "pydantic": pydantic_chat},
    "responses_delta": {"old": old_responses, "new": new_responses},
    "anthropic_delta": {"old": old_anthropic, "new": new_anthropic},
    "ollama_line": {"old": old_ollama, "new": new_ollama},
}


def cpu_seconds(encode: Callable[[int], bytes], chunks: int) -> float:
    started = time.process_time()
    for index in range(chunks):
        encode(index)
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for shape, variants in VARIANTS.items():  # the shapes must not have changed
        outputs = {name: encode(7) for name, encode in variants.items() if name != "pydantic"}
        assert len(set(outputs.values())) == 1 or shape == "ollama_line", (shape, outputs)
    samples: dict[str, dict[str, list[float]]] = {shape: {name: [] for name in v} for shape, v in VARIANTS.items()}
    for _ in range(args.rounds):
        for shape, variants in VARIANTS.items():
            for name, encode in variants.items():
                samples[shape][name].append(cpu_seconds(encode, args.chunks) / args.chunks * 1e6)
    report: dict[str, Any] = {"chunks": args.chunks, "rounds": args.rounds, "unit": "CPU µs per chunk (median)"}
    for shape, by_name in samples.items():
        medians = {name: round(statistics.median(values), 3) for name, values in by_name.items()}
        ratios = [new / old for new, old in zip(by_name["new"], by_name["old"], strict=True)]
        report[shape] = {**medians, "new/old": round(statistics.median(ratios), 3)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
