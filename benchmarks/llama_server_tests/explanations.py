"""Why each remaining failure of llama.cpp's server tests fails here: (file, test-id prefix) → one line.

The kinds: the tests' model's own text or vocabulary (stories260K, bert-bge-small, ...: the default model serves
every preset here, offline), a llama-server flag or feature without an equivalent here (on purpose or not yet),
a difference of design (said why).
"""

from __future__ import annotations

MODEL_TEXT = "model-specific: expects the text stories260K writes; the default model (Qwen2.5-Coder) writes other text"
SEED = "flag without an equivalent: --seed 42 (no server-wide seed here; a request's `seed` is honoured)"
SLOTS = "by design: no fixed slots (one continuous batch), so /slots answers 501 as llama-server does with --no-slots"

REASONS: list[tuple[str, str, str]] = [
    ("test_basic", "test_server_multiple_addresses",
     "flag without an equivalent: --host with two addresses (`127.0.0.1,::1`); edge-llm listens on one"),
    ("test_basic", "test_server_props",
     "by design: `n_ctx` is what one request may use, the whole shared context (llama-server splits it in fixed "
     "slots: n_ctx / --parallel); and " + SEED.split(": ", 1)[1]),
    ("test_basic", "test_server_models",
     "by design: /models lists the model under its file name; an --alias is another name it answers to (and is "
     "echoed in answers' `model`), not its id"),
    ("test_basic", "test_server_slots", SLOTS),
    ("test_basic", "test_load_split_model", MODEL_TEXT + " (a split stories15M model)"),
    ("test_basic", "test_no_ui",
     "by design: GET / answers Ollama's probe text to a non-browser client (Ollama clients check it); a browser "
     "(Accept: text/html) gets the web chat; no --no-ui flag"),
    ("test_basic", "test_server_model_aliases_and_tags",
     "not implemented: several comma-separated --alias names and --tags listed in /models' `aliases` and `tags`"),
    ("test_tokenize", "test_tokenize_with_bos",
     "model-specific: expects stories260K's BOS id 1 first; Qwen2.5-Coder's vocabulary adds no BOS"),
]


def explain(file: str, test: str) -> str | None:
    for reason_file, prefix, reason in REASONS:
        if reason_file == file and test.startswith(prefix):
            return reason
    return None
