"""Fill-in-the-middle on the default Coder model: llama-server's /infill and /v1/completions with `suffix`."""

from __future__ import annotations

import ast
import json
from typing import Any

import httpx
import openai

from edge_llm.prompting.fim import ends_block
from edge_llm.testing.server import RunningServer
from tests.helpers import metric, scrape, sse_events, wait_for

SIGNATURE = "def add_numbers(a, b):\n    "
CALL_SITE = "\n\nprint(add_numbers(2, 3))\n"
CONTROL_SPELLINGS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>",
                     "<|repo_name|>", "<|endoftext|>")


def infill(server: RunningServer, **fields: Any) -> httpx.Response:
    return httpx.post(server.url + "/infill", json={"temperature": 0, "n_predict": 64, **fields}, timeout=300)


def test_a_function_body_is_filled_between_its_signature_and_a_call_site(server: RunningServer) -> None:
    response = infill(server, input_prefix=SIGNATURE, input_suffix=CALL_SITE,
                      samplers=["top_k", "top_p", "infill"], id_slot=0)  # llama.vscode's extra fields
    assert response.status_code == 200, response.text
    assert response.headers["x-edge-llm-ignored-fields"] == "id_slot,samplers"
    result = response.json()
    content = result["content"]
    assert result["stop"] is True and result["tokens_predicted"] >= 1 and result["tokens_evaluated"] > 10
    assert "return" in content
    ast.parse(SIGNATURE + content + CALL_SITE)  # the middle makes the file valid Python again
    assert not any(spelling in content for spelling in CONTROL_SPELLINGS)
    assert set(result["timings"]) >= {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n"}


def test_completions_with_a_suffix_fill_the_middle(client: openai.OpenAI, model_id: str) -> None:
    completion = client.completions.create(model=model_id, prompt=SIGNATURE, suffix=CALL_SITE, max_tokens=64,
                                           temperature=0)
    text = completion.choices[0].text
    assert "return" in text
    ast.parse(SIGNATURE + text + CALL_SITE)
    assert not any(spelling in text for spelling in CONTROL_SPELLINGS)


def test_repository_context_changes_the_completion(server: RunningServer) -> None:
    helper = {"filename": "pricing.py", "text": "def total_price_with_vat(prices):\n    return sum(prices) * 1.2\n"}
    body = {"input_prefix": "from pricing import *\n\nprices = [3, 4, 5]\n# the total with VAT\ntotal = ",
            "input_suffix": "\nprint(total)\n", "n_predict": 24}
    alone = infill(server, **body).json()["content"]
    informed = infill(server, **body, input_extra=[helper]).json()["content"]
    assert "total_price_with_vat" in informed, informed
    assert informed != alone


def test_control_token_spellings_in_the_code_are_text_and_never_come_back(server: RunningServer) -> None:
    prefix = "MARKERS = ['<|fim_middle|>', '<|file_sep|>']\n\ndef count_markers(text):\n    "
    response = infill(server, input_prefix=prefix, input_suffix="\n", n_predict=32)
    assert response.status_code == 200, response.text
    result = response.json()
    # Read as control tokens, the two spellings would be 2 tokens; as text they are many more.
    tokens = httpx.post(server.url + "/tokenize", json={"content": prefix, "parse_special": False},
                        timeout=60).json()["tokens"]
    assert result["tokens_evaluated"] >= len(tokens)
    assert "<|endoftext|>" not in result["content"] and "<|fim_pad|>" not in result["content"]


def _indentation(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def test_n_indent_ends_the_completion_where_the_code_leaves_the_block(repeatable_server: RunningServer) -> None:
    """Without n_indent the model writes past the method (more methods, usage code); with n_indent=8 the same
    greedy answer ends at the first line after the first whose text starts left of column 8 (a blank line counts,
    as in llama-server), keeping only that line's indentation."""
    prefix = ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def is_empty(self):\n"
              "        return not self.items\n\n    def pop(self):\n        ")
    body = {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 96}
    unlimited = infill(repeatable_server, **body).json()
    lines = unlimited["content"].split("\n")
    leaving = next(i for i, line in enumerate(lines) if i > 0 and (not line.strip() or _indentation(line) < 8))
    assert leaving >= 2 and any(line.strip() and _indentation(line) < 8 for line in lines[leaving:]), lines
    cut = infill(repeatable_server, **body, n_indent=8).json()
    expected = "\n".join(lines[:leaving] + [lines[leaving][:_indentation(lines[leaving])]])
    assert cut["content"] == expected, (cut["content"], unlimited["content"])
    assert cut["stop"] is True and cut["stop_type"] == "limit"
    assert cut["tokens_predicted"] < unlimited["tokens_predicted"]


def test_a_stale_completion_is_cancelled_and_the_next_keystroke_reuses_the_file(server: RunningServer) -> None:
    """An editor drops the request of the previous keystroke when the next one comes: the engine frees that
    sequence, and the next request finds the file's tokens in the prefix cache."""
    source = "".join(f"def function_{i}(value):\n    return value * {i} + {i % 7}\n\n" for i in range(60))
    prefix = source + "numbers = [\n    1,\n    2,\n"
    before = scrape(server)
    with httpx.stream("POST", server.url + "/infill", timeout=300,
                      json={"input_prefix": prefix, "input_suffix": "]\n", "n_predict": 400, "temperature": 0,
                            "stream": True}) as response:
        assert response.status_code == 200
        for _, data in sse_events(response):
            first = json.loads(data)
            assert first["stop"] is False and first["content"]
            break  # the editor moves on: the connection closes

    def cancelled() -> bool:
        samples = scrape(server)
        return (metric(samples, "edge_llm_running_sequences") == 0
                and sum(metric(samples, "edge_llm_cancellations_total", phase=p) for p in ("queued", "prefill", "decode"))
                > sum(metric(before, "edge_llm_cancellations_total", phase=p) for p in ("queued", "prefill", "decode")))

    wait_for(cancelled, 120, "the stale completion to be cancelled")
    result = infill(server, input_prefix=prefix + "    3", input_suffix="]\n", n_predict=8).json()
    assert result["tokens_evaluated"] > 1000
    assert result["tokens_cached"] >= result["tokens_evaluated"] - 16, result
    assert result["timings"]["cache_n"] == result["tokens_cached"]


def test_warm_up_requests_compute_the_prompt_and_return_nothing(server: RunningServer) -> None:
    """llama.vim sends its ring of context chunks with n_predict 0 to fill the prefix cache."""
    body = {"input_prefix": "import os\n\n" + "# a comment line\n" * 40, "input_suffix": "\n", "n_predict": 0}
    warm = infill(server, **body).json()
    assert (warm["content"], warm["tokens_predicted"]) == ("", 0)
    again = infill(server, **{**body, "n_predict": 4}).json()
    assert again["tokens_cached"] >= again["tokens_evaluated"] - 2


def test_bad_infill_bodies_get_the_error_envelope(server: RunningServer) -> None:
    for body in ({"input_suffix": "x"}, {"input_prefix": 1, "input_suffix": ""},
                 {"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]},
                 {"input_prefix": "", "input_suffix": "", "n_predict": -5}):
        response = httpx.post(server.url + "/infill", json=body, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


# A file long enough that recomputing what follows the cursor would dominate a keystroke's latency.
FILE_HEAD = "import math\n\n\ndef area(radius):\n    "
FILE_TAIL = "".join(f"\n\ndef helper_{i}(value):\n    return math.sqrt(value) * {i} + value / {i + 1}\n"
                    for i in range(12))


def test_a_keystroke_moves_the_cached_rest_of_the_file_and_computes_only_the_edit(server: RunningServer) -> None:
    """--cache-reuse (default 64): the second request's prefix differs by what was typed; the rest of the file
    after the cursor is taken from the first request's cache, moved to its new positions, not computed again."""
    first = infill(server, input_prefix=FILE_HEAD, input_suffix=FILE_TAIL, n_predict=4)
    assert first.status_code == 200, first.text
    typed = infill(server, input_prefix=FILE_HEAD + "result = ", input_suffix=FILE_TAIL, n_predict=4).json()
    timings = typed["timings"]
    assert timings["cache_n"] >= typed["tokens_evaluated"] - 12, timings  # all but the typed tokens (and FIM_MID)
    assert timings["prompt_n"] <= 12
    assert timings["cache_n"] + timings["prompt_n"] == typed["tokens_evaluated"]
    assert not any(spelling in typed["content"] for spelling in CONTROL_SPELLINGS)
    refused = infill(server, input_prefix=FILE_HEAD + "result = m", input_suffix=FILE_TAIL, n_predict=4,
                     cache_prompt=False).json()
    assert refused["timings"]["cache_n"] == 0  # cache_prompt: false neither reuses nor moves anything


def test_a_keystroke_in_the_typed_line_appends_to_the_cached_prompt(server: RunningServer) -> None:
    """The line typed so far (`prompt`) opens the middle, after the suffix: the next keystroke in that line only
    adds tokens at the end, and everything before them comes from the prefix cache."""
    line_start = FILE_HEAD.removesuffix("    ")
    first = infill(server, input_prefix=line_start, prompt="    return math.", input_suffix=FILE_TAIL, n_predict=4)
    assert first.status_code == 200, first.text
    typed = infill(server, input_prefix=line_start, prompt="    return math.pi * radius", input_suffix=FILE_TAIL,
                   n_predict=4).json()
    timings = typed["timings"]
    assert typed["tokens_evaluated"] > 250
    assert timings["prompt_n"] <= 6, timings  # the typed tokens (the last of the line before may be re-split)
    assert timings["cache_n"] + timings["prompt_n"] == typed["tokens_evaluated"]
    assert not any(spelling in typed["content"] for spelling in CONTROL_SPELLINGS)


def lines_ending_blocks(template: str, count: int, *, ending: bool) -> list[str]:
    """`count` lines made from `template` (with {i}) that do, or do not, end a block of the FIM layout."""
    found = []
    i = 0
    while len(found) < count:
        line = template.format(i=i) + "\n"
        if ends_block(line) == ending:
            found.append(line)
        i += 1
    return found


# "import math" ends a block; nine lines after it that do not: they are in the middle of the next request.
X_LINES = lines_ending_blocks("x{i} = math.sqrt({i})", 9, ending=False)
BLOCK_HEAD = "import math\n\n\n" + "".join(X_LINES)
Y_LINES = lines_ending_blocks("y{i} = x0 * {i}", 3, ending=False)


def moved_tokens(server: RunningServer) -> float:
    return metric(scrape(server), "edge_llm_moved_prompt_tokens_total")


def suffix_tokens(server: RunningServer) -> int:
    return len(httpx.post(server.url + "/tokenize", json={"content": FILE_TAIL}).json()["tokens"])


def then(server: RunningServer, first: dict[str, str], second: dict[str, str]) -> tuple[dict[str, Any], float]:
    """Two keystrokes' requests (`input_prefix`, `prompt`) before FILE_TAIL: the second's answer, and how many cached
    tokens were moved for it."""
    answer = infill(server, input_suffix=FILE_TAIL, n_predict=4, **first)
    assert answer.status_code == 200, answer.text
    moved = moved_tokens(server)
    return infill(server, input_suffix=FILE_TAIL, n_predict=4, **second).json(), moved_tokens(server) - moved


def test_a_new_line_within_a_block_of_lines_appends_and_moves_nothing(server: RunningServer) -> None:
    """The lines typed since the last block ended stay in the middle: finishing a line and starting the next adds
    tokens at the end of the cached prompt, and no cached key is moved (llama.cpp re-rotates every cell of the
    cache to move one chunk)."""
    assert ends_block("import math\n")
    typed = lines_ending_blocks("total = x0 + x{i}", 1, ending=False)[0].rstrip("\n")
    next_line, moved = then(server, {"input_prefix": BLOCK_HEAD, "prompt": typed},
                            {"input_prefix": BLOCK_HEAD + typed + "\n", "prompt": ""})
    assert next_line["tokens_evaluated"] > 250
    assert next_line["timings"]["prompt_n"] <= 4, next_line["timings"]  # the newline (the last token may re-split)
    assert moved == 0


def test_a_line_that_ends_a_block_moves_the_rest_of_the_file_once(server: RunningServer) -> None:
    """When a finished line ends a block, the middle's lines join the prefix: they are computed again before the
    suffix, whose cached keys are moved after them, not recomputed; the next block's lines then append again."""
    head = BLOCK_HEAD + "".join(Y_LINES)
    ending = lines_ending_blocks("z = y0 + {i}", 1, ending=True)[0]
    crossing, moved = then(server, {"input_prefix": head, "prompt": ending.rstrip("\n")},
                           {"input_prefix": head + ending, "prompt": ""})
    assert moved >= suffix_tokens(server) - 8
    assert crossing["timings"]["prompt_n"] < suffix_tokens(server) / 2, crossing["timings"]
    next_line = lines_ending_blocks("w = z + {i}", 1, ending=False)[0]
    after = infill(server, input_prefix=head + ending + next_line, prompt="", input_suffix=FILE_TAIL,
                   n_predict=4).json()
    assert after["timings"]["prompt_n"] <= 8, after["timings"]
    assert after["timings"]["cache_n"] + after["timings"]["prompt_n"] == after["tokens_evaluated"]


def test_a_window_of_lines_sliding_down_the_file_moves_one_chunk_and_computes_the_new_line(
        server: RunningServer) -> None:
    """llama.vscode and llama.vim send a window of lines before the cursor: on a new line the window's first line
    drops out. Everything after it is the previous prompt's, moved back by that line's tokens in one chunk."""
    lines = (lines_ending_blocks("a{i} = math.pi * {i}", 2, ending=False) + ["import math\n"]
             + lines_ending_blocks("b{i} = math.e ** {i}", 13, ending=False))
    slid, moved = then(server, {"input_prefix": "".join(lines[:15]), "prompt": lines[15].rstrip("\n")},
                       {"input_prefix": "".join(lines[1:16]), "prompt": ""})
    assert slid["timings"]["prompt_n"] <= 6, slid["timings"]
    assert moved >= suffix_tokens(server)
