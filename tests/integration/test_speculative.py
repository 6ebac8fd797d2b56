"""Speculative decoding on the real model (issue 17): greedy answers with drafts are the answers without them.

Both servers run one sequence at a time without the prefix cache (`drafting_server`, the session's `repeatable_server`,
with `--speculative ngram`, the default; `plain_server` with `--speculative off`). A draft changes the batch a token's
logits are computed in, which changes llama.cpp's rounding as a batch mate does, so two answers may part at a near-tie
and nowhere else (tests/helpers.agreeing_tokens); a wrongly accepted or lost token is not a near-tie and fails.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from edge_llm.testing.server import RunningServer
from tests.helpers import agreeing_tokens, metric, scrape, total
from tests.server_pool import REPEATABLE_FLAGS, ServerWith

CHAT = "/v1/chat/completions"

CODE = '''def load_orders(path):
    orders = []
    with open(path) as handle:
        for line in handle:
            fields = line.strip().split(",")
            if len(fields) != 3:
                continue
            orders.append({"id": fields[0], "item": fields[1], "qty": int(fields[2])})
    return orders


def total_quantity(orders):
    qty_sum = 0
    for order in orders:
        qty_sum += order["qty"]
    return qty_sum


def items_by_count(orders):
    counts = {}
    for order in orders:
        counts[order["item"]] = counts.get(order["item"], 0) + order["qty"]
    return sorted(counts.items(), key=lambda pair: pair[1], reverse=True)
'''

PROMPTS = [
    f"Rename the variable `qty_sum` to `total` in this code and reply with the whole code only:\n\n{CODE}",
    f"Add type hints to every function in this code and reply with the whole code only:\n\n{CODE}",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the numbers from 1 to 40, one per line.",
]


@pytest.fixture(scope="module")
def drafting_server(repeatable_server: RunningServer) -> RunningServer:
    return repeatable_server  # --speculative ngram is the default


@pytest.fixture(scope="module")
def plain_server(server_with: ServerWith) -> RunningServer:
    return server_with(*REPEATABLE_FLAGS, "--speculative", "off")


def chat(server: RunningServer, content: str, **fields: Any) -> dict[str, Any]:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 200,
            "logprobs": True, "top_logprobs": 2, **fields}
    response = httpx.post(server.url + CHAT, json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_answers_with_drafts_are_the_answers_without(drafting_server: RunningServer,
                                                            plain_server: RunningServer) -> None:
    before = scrape(drafting_server)
    accepted_on_code = 0
    for index, prompt in enumerate(PROMPTS):
        # The code edits long enough to draft a lot (120 tokens each: ~200 of the 240 accepted, measured), prose
        # only to compare.
        length = 120 if index < 2 else 48
        drafted, plain = chat(drafting_server, prompt, max_tokens=length), chat(plain_server, prompt, max_tokens=length)
        entries = drafted["choices"][0]["logprobs"]["content"]
        assert len(entries) == drafted["usage"]["completion_tokens"], "one logprob entry per emitted token"
        shared = agreeing_tokens(entries, plain["choices"][0]["logprobs"]["content"])
        if shared == min(len(entries), len(plain["choices"][0]["logprobs"]["content"])):
            assert drafted["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
        assert "draft_n" not in plain["timings"]
        if index < 2:
            accepted_on_code += drafted["timings"].get("draft_n_accepted", 0)
    assert accepted_on_code > 100, "the code edits were barely drafted"
    after = scrape(drafting_server)
    drafted_tokens = metric(after, "edge_llm_speculative_drafted_tokens_total") - \
        metric(before, "edge_llm_speculative_drafted_tokens_total")
    accepted_tokens = metric(after, "edge_llm_speculative_accepted_tokens_total") - \
        metric(before, "edge_llm_speculative_accepted_tokens_total")
    assert 0 < accepted_tokens <= drafted_tokens
    assert total(after, "edge_llm_speculative_accepted_by_position_total") == \
        metric(after, "edge_llm_speculative_accepted_tokens_total")


def test_stop_strings_grammar_and_opt_out_with_drafts(drafting_server: RunningServer,
                                                      plain_server: RunningServer) -> None:
    # a stop string inside text the drafts copy from the prompt
    stop = chat(drafting_server, PROMPTS[0], stop=["def items_by_count"], max_tokens=400)
    assert stop["choices"][0]["finish_reason"] == "stop"
    assert "items_by_count" not in stop["choices"][0]["message"]["content"]
    assert "def total_quantity" in stop["choices"][0]["message"]["content"]
    # under a grammar every drafted token is checked as the sampler would: the answer is the grammar's
    schema = {"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"}}},
              "required": ["names"]}
    fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "names", "schema": schema}}}
    prompt = ("Return the function names defined in this code as JSON {\"names\": [...]}, repeated three times in "
              f"the list:\n\n{CODE}")
    drafted, plain = chat(drafting_server, prompt, **fields), chat(plain_server, prompt, **fields)
    agreeing_tokens(drafted["choices"][0]["logprobs"]["content"], plain["choices"][0]["logprobs"]["content"])
    if drafted["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(drafted["choices"][0]["message"]["content"])["names"], list)
    # opting out
    opted_out = chat(drafting_server, PROMPTS[0], speculative=False, max_tokens=20)
    assert "draft_n" not in opted_out["timings"]
    sampled = chat(drafting_server, PROMPTS[0], temperature=0.7, seed=1, max_tokens=60)
    assert "draft_n" in sampled["timings"]  # sampled requests speculate too (the same distribution)
