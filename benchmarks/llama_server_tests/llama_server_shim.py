#!/usr/bin/env python3
"""A `llama-server` stand-in: takes llama-server's argv and execs `edge-llm serve` with the equivalent flags.

llama.cpp's server tests (tools/server/tests) start `$LLAMA_SERVER_BIN_PATH` with llama-server's flags; pointing
that variable at this file runs them against this server. Every model they name (`--hf-repo`, `--hf-file`,
`--model`, `--model-url`: stories260K, bert-bge-small, jina-reranker, ...) is served by the default model file (the
machine is offline, and this server serves GGUF files it has); flags without an equivalent are dropped, and both
kinds of change are printed to stderr, one line each, so the test log says what was run.

The interpreter that runs edge_llm is $EDGE_LLM_PYTHON, else the one running this file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge_llm.models.fetch import default_model_path
from edge_llm.prompting.builtin_templates import BUILTIN_TEMPLATES


@dataclass(frozen=True)
class Flag:
    """How one llama-server flag becomes ours: `to` builds our flags from its value (None: dropped, `why` says why)."""

    takes_value: bool
    to: Callable[[str], list[str]] | None = None
    why: str = ""


def same(ours: str) -> Callable[[str], list[str]]:
    return lambda value: [ours, value]


def switch(ours: str) -> Callable[[str], list[str]]:
    return lambda _value: [ours]


def model_file(_value: str) -> list[str]:
    return ["--model", str(default_model_path())]


def speculative(value: str) -> list[str]:
    return ["--speculative", "ngram" if value.startswith("ngram") else "off"]


def pooling(value: str) -> list[str]:
    return ["--pooling", value] if value in ("mean", "last", "cls") else []


def chat_template(value: str) -> list[str]:
    """A built-in name this server knows too is passed on; llama.cpp's others (command-r, deepseek3, ...) are not
    (a name this server does not know would be read as a Jinja string, and refused at start)."""
    return ["--chat-template", value] if value in BUILTIN_TEMPLATES else []


def n_predict(value: str) -> list[str]:
    """llama-server's --n-predict is the default of a request that names no n_predict / max_tokens, not a cap (a
    request's own n_predict wins: server-context.cpp n_predict_max)."""
    if int(value) < 0:
        return []
    return ["--default-max-tokens", value]


ALWAYS_ON = "always on here"
NO_EQUIVALENT = "no equivalent here"

FLAGS: dict[str, Flag] = {
    "--port": Flag(True, same("--port")),
    "--host": Flag(True, same("--host")),
    "--temp": Flag(True, same("--default-temperature")),
    "--model": Flag(True, model_file),
    "-m": Flag(True, model_file),
    "--hf-repo": Flag(True, model_file),
    "-hf": Flag(True, model_file),
    "--hf-file": Flag(True, model_file),
    "--model-url": Flag(True, model_file),
    "--alias": Flag(True, same("--model-alias")),
    "-a": Flag(True, same("--model-alias")),
    "--ctx-size": Flag(True, same("--ctx-size")),
    "-c": Flag(True, same("--ctx-size")),
    "--parallel": Flag(True, same("--parallel")),
    "-np": Flag(True, same("--parallel")),
    "--batch-size": Flag(True, same("--batch-size")),
    "-b": Flag(True, same("--batch-size")),
    "--threads": Flag(True, same("--threads")),
    "-t": Flag(True, same("--threads")),
    "-ctk": Flag(True, same("--cache-type-k")),
    "--cache-type-k": Flag(True, same("--cache-type-k")),
    "-ctv": Flag(True, same("--cache-type-v")),
    "--cache-type-v": Flag(True, same("--cache-type-v")),
    "-fa": Flag(True, same("--flash-attn")),
    "--flash-attn": Flag(True, same("--flash-attn")),
    "--n-predict": Flag(True, n_predict, "-1 (no limit) is the default here"),
    "-n": Flag(True, n_predict, "-1 (no limit) is the default here"),
    "--api-key": Flag(True, same("--api-key")),
    "--cors-origins": Flag(True, same("--cors-origins")),
    "--pooling": Flag(True, pooling, "a pooling type this server does not offer (mean, last, cls here)"),
    "--spec-type": Flag(True, speculative),
    "--cache-reuse": Flag(True, same("--cache-reuse")),
    "--verbose": Flag(False, lambda _v: ["--log-level", "debug"]),
    "--embedding": Flag(False, None, ALWAYS_ON),
    "--embeddings": Flag(False, None, ALWAYS_ON),
    "--metrics": Flag(False, None, ALWAYS_ON),
    "--cont-batching": Flag(False, None, ALWAYS_ON),
    "--jinja": Flag(False, None, ALWAYS_ON),
    "--kv-unified": Flag(False, None, ALWAYS_ON),
    "--no-slots": Flag(False, None, "/slots answers 501 as llama-server's --no-slots does"),
    "--offline": Flag(False, None, "this server never downloads"),
    "--seed": Flag(True, same("--seed")),
    "-s": Flag(True, same("--seed")),
    "--tags": Flag(True, same("--tags")),
    "--chat-template": Flag(True, chat_template, "not a built-in template name here"),
    "--no-jinja": Flag(False, None, "the GGUF's chat template is always rendered as Jinja"),
    "--slots": Flag(False, None, "no fixed slots: sequences share one continuous batch"),
}

# Every other flag llama.cpp's tests pass (tools/server/tests/utils.py): dropped, no equivalent here.
DROPPED_WITH_VALUE = (
    "--model-draft", "--models-dir", "--models-max", "--models-preset", "--ubatch-size", "-ub", "--n-gpu-layers",
    "-ngl", "--slot-save-path", "--grp-attn-n", "--grp-attn-w", "--lora", "--spec-draft-n-max",
    "--spec-draft-n-min", "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning",
    "--chat-template-file", "--mmproj-url", "--media-path", "--sleep-idle-seconds",
    "--cache-ram", "--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json",
)
DROPPED_SWITCHES = (
    "--reranking", "--rerank", "--swa-full", "--context-shift", "--no-ui", "--no-models-autoload", "--no-mmproj",
    "--no-cache-idle-slots", "--ui-mcp-proxy", "--backend_sampling",
)


def flag(name: str) -> Flag:
    if name in FLAGS:
        return FLAGS[name]
    return Flag(name in DROPPED_WITH_VALUE, None, NO_EQUIVALENT)


def translate(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Our `serve` flags for llama-server's argv, and one note per flag changed or dropped."""
    ours: list[str] = []
    notes: list[str] = []
    model_given = False
    index = 0
    while index < len(argv):
        name = argv[index]
        spec = flag(name)
        value = argv[index + 1] if spec.takes_value and index + 1 < len(argv) else ""
        index += 2 if spec.takes_value else 1
        if spec.to is None:
            notes.append(f"dropped {name} {value}".rstrip() + f": {spec.why}")
            continue
        translated = spec.to(value)
        if not translated:  # a value this server has no equivalent for (e.g. a template name it does not know)
            notes.append(f"dropped {name} {value}: {spec.why or NO_EQUIVALENT}")
            continue
        if spec.to is model_file:
            notes.append(f"{name} {value} → the default model {translated[1]} (offline)")
            if model_given:
                continue
            model_given = True
        ours.extend(translated)
    if not model_given:
        ours.extend(model_file(""))
        notes.append(f"no model named → the default model {default_model_path()}")
    return ours, notes


def main() -> None:
    ours, notes = translate(sys.argv[1:])
    for note in notes:
        print(f"llama-server shim: {note}", file=sys.stderr)
    python = os.environ.get("EDGE_LLM_PYTHON", sys.executable)
    command = [python, "-m", "edge_llm", "serve", *ours, "--log-format", "text"]
    print(f"llama-server shim: exec {' '.join(command)}", file=sys.stderr, flush=True)
    os.execv(python, command)


if __name__ == "__main__":
    main()
