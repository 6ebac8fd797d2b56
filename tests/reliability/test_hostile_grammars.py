"""Hostile grammars (issue 41): each is refused before llama.cpp sees it (400 naming the rule) or ended by the step
budget (--grammar-step-budget-ms) while a neighbour's 2-token request, sent at the same time, completes about as
fast as it does alone, and the server stays up. A property-based run sends grammars drawn from a small grammar of
grammars the same way; docs/reliability.md records the cases and the worst neighbour delay.

`EDGE_LLM_GRAMMAR_EXAMPLES` (default 15) sets how many generated grammars it sends.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_llm.testing.server import RunningServer, run_server
from tests.reliability.support import (
    assert_neighbour_unhurt,
    neighbour_alone,
    neighbour_beside,
    neighbour_seconds,
    COMPLETIONS,
    TIMEOUT,
    assert_envelope,
    assert_error,
    assert_no_unhandled_errors,
    assert_serving,
    env_int,
)

logger = logging.getLogger(__name__)

EXAMPLES = env_int("EDGE_LLM_GRAMMAR_EXAMPLES", 15)
STEP_BUDGET_MS = 300  # the costly grammar's request ends after this much of one step (plus one slice)


def doubling(levels: int, char: str = "x") -> str:
    lines = [f'a0 ::= "{char}" | ""'] + [f'a{k} ::= a{k - 1} a{k - 1} | ""' for k in range(1, levels + 1)]
    return "\n".join(lines + [f"root ::= a{levels}"]) + "\n"


# The hostile probe's grammars (issue 41), each with the rule its 400 must name.
REFUSED = {
    "60,000 groups behind a comment": ('# "\nroot ::= ' + "(" * 60_000 + "[a]" + ")" * 60_000, "nests groups"),
    "doubling, 16 levels": (doubling(16), "parse stacks|too many ways"),
    "doubling, 40 levels": (doubling(40), "parse stacks|too many ways"),
    "nullable alternatives repeated 40 times": ('root ::= ("a"? | "b"?){0,40}', "rule 'root' repeats something"),
    "nested repetitions": ('root ::= (("a"?){0,2000}){0,2000}', "multiply to more than 2000"),
    "nested repetitions through a rule": ('root ::= x{1,2000}\nx ::= "a"{1,2000}', "rule 'root' nests repetitions"),
    "left recursion behind a nullable rule": ('root ::= x "a"\nx ::= y root\ny ::= "b"?', "left-recursive"),
    # Found by the generated grammars: llama.cpp writes 2^64 optional copies (gigabytes, the OOM killer) for this.
    "a repetition's maximum below its minimum": ('root ::= "a"{3,2}', "maximum below its minimum"),
}

# Within the static bounds (257 stacks) but about 5 s for one pass over the vocabulary on this machine: the step
# budget ends it. The tokens of "§" runs are pushed out of the model's likeliest ones (logit_bias), so that the
# whole vocabulary is checked, as a grammar of text the model would not write makes it.
COSTLY = doubling(8, "§").replace("root ::= a8", 'root ::= a8 "§"')


def unlikely(server: RunningServer, text: str) -> dict[str, float]:
    """logit_bias pushing down every token of `text` runs (not banning them: the grammar needs them)."""
    tokens: set[int] = set()
    for length in range(1, 9):
        response = httpx.post(server.url + "/tokenize", json={"content": text * length}, timeout=TIMEOUT)
        tokens.update(response.json()["tokens"])
    return {str(token): -40.0 for token in tokens}


@pytest.fixture(scope="module")
def grammar_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_server(tmp_path_factory.mktemp("grammars"), "--parallel", "2", "--ctx-size", "2048",
                    "--cache-slots", "0", "--grammar-step-budget-ms", str(STEP_BUDGET_MS)) as running:
        yield running
        assert_serving(running)
        assert_no_unhandled_errors(running)


@pytest.fixture(scope="module")
def alone(grammar_server: RunningServer) -> float:
    return neighbour_alone(grammar_server)


def beside_a_neighbour(server: RunningServer, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    """Sends `body` and, once it is in flight, the neighbour; the hostile answer and the neighbour's time."""
    answers: list[httpx.Response] = []
    sent = threading.Event()

    def hostile() -> None:
        with httpx.Client(timeout=TIMEOUT) as client:
            request = client.build_request("POST", server.url + COMPLETIONS, json=body)
            sent.set()
            answers.append(client.send(request))

    thread = threading.Thread(target=hostile)
    thread.start()
    sent.wait()
    took = neighbour_seconds(server)
    thread.join(TIMEOUT)
    assert answers, "the hostile request never got an answer"
    return answers[0], took


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_hostile_grammars_are_refused_naming_the_reason(grammar_server: RunningServer, alone: float,
                                                        case: str) -> None:
    grammar, reason = REFUSED[case]
    response, took = beside_a_neighbour(grammar_server, {"prompt": "x", "max_tokens": 1, "grammar": grammar})
    error = assert_error(response, 400)
    assert any(part in error["message"] for part in reason.split("|")), error
    assert_neighbour_unhurt(took, alone, case)


def test_a_grammar_over_the_step_budget_ends_its_request_not_the_others(grammar_server: RunningServer,
                                                                        alone: float) -> None:
    response, took = beside_a_neighbour(grammar_server, {"prompt": "x", "max_tokens": 4, "grammar": COSTLY,
                                                         "temperature": 0, "logit_bias": unlikely(grammar_server, "§")})
    error = assert_error(response, 400, "grammar_too_costly")
    assert "ms in one step" in error["message"], error
    assert_neighbour_unhurt(took, alone, "the costly grammar")
    assert grammar_server.process.poll() is None


# Every split of a run of spaces between the two alternatives is a walk of llama.cpp's candidate check: a pass over
# this model's vocabulary did not end within 60 s (its tokens of spaces then a newline are rejected only after
# every split is walked). The prompt makes indentation the likeliest continuation.
AMBIGUOUS_SPACES = 'root ::= (" " | " ")*'
INDENTED = "def area(width, height):\n    if width > 0:\n        return width * height\n    else:\n        "


def test_an_ambiguous_grammar_is_refused_before_it_can_hold_a_step(grammar_server: RunningServer,
                                                                   alone: float) -> None:
    body = {"prompt": INDENTED, "max_tokens": 8, "temperature": 0, "grammar": AMBIGUOUS_SPACES}
    response = neighbour_beside(grammar_server, COMPLETIONS, json.dumps(body).encode(), alone, "ambiguous spaces")
    error = assert_error(response, 400)
    assert "grammar rule 'root' is ambiguous" in error["message"], error


def largest_grammars() -> dict[str, str]:
    """Grammars of about the size limit (256 Ki characters), both checked within the ambiguity check's bound
    (gbnf/ambiguity.py MAX_WORK) and answered: 21,000 loops, 6,000 rules in turn."""
    loops = "root ::= " + " ".join(f'"{i % 10}" [ -~]*' for i in range(21_000))
    rules = [f'r{i} ::= "k{i}" ":" [a-z]{{1,8}}' for i in range(6_000)]
    fields = "root ::= r0" + "".join(f' "," r{i}' for i in range(1, 6_000)) + "\n" + "\n".join(rules)
    return {"21 000 loops": loops, "6 000 rules in turn": fields}


@pytest.mark.parametrize("case", list(largest_grammars()))
def test_a_grammar_of_the_largest_size_is_answered_and_the_server_goes_on(grammar_server: RunningServer,
                                                                          alone: float, case: str) -> None:
    grammar = largest_grammars()[case]
    assert 200_000 < len(grammar) <= 256 * 1024
    body = json.dumps({"prompt": "x", "max_tokens": 1, "grammar": grammar}).encode()
    response = neighbour_beside(grammar_server, COMPLETIONS, body, alone, case)
    assert response.status_code == 200, response.text  # 21,000 loops were too costly to check before issue 41
    assert_serving(grammar_server)


# ---- generated grammars ---------------------------------------------------------------------------------------

NAMES = ["root", "r1", "r2", "r3"]
TERMINALS = ['"a"', '"ab"', '""', '"x"', "[a-c]", "[^a]", ".", '" "', '"\\n"', '"{"', "[0-9]"]
SUFFIXES = ["", "", "", "", "", "", "*", "+", "?", "?", "{2}", "{0,3}", "{1,}", "{0,40}", "{2000}"]


@st.composite
def items(draw: st.DrawFn, rule: int, depth: int = 0) -> str:
    """One item of rule number `rule`: mostly terminals and later rules (so that many grammars are usable), now
    and then an earlier rule (recursion), a group, a repetition."""
    choice = draw(st.integers(0, 9))
    if choice < 2 and depth < 2:
        inner = draw(st.lists(st.lists(items(rule, depth + 1), min_size=1, max_size=3), min_size=1, max_size=3))
        item = "(" + " | ".join(" ".join(sequence) for sequence in inner) + ")"
    elif choice < 4:
        later = NAMES[rule + 1:] or NAMES[1:]
        item = draw(st.sampled_from(later if choice < 3 or rule == 0 else NAMES[:rule + 1]))
    else:
        item = draw(st.sampled_from(TERMINALS))
    suffix = draw(st.sampled_from(SUFFIXES))
    return item + suffix if item != '""' else item


@st.composite
def grammars(draw: st.DrawFn) -> str:
    rules = []
    for number, name in enumerate(NAMES):
        alternatives = draw(st.lists(st.lists(items(number), min_size=0, max_size=3), min_size=1, max_size=3))
        # An empty alternative is written `""`: after `::=` llama.cpp skips newlines, so an empty body would take
        # the next line as its own.
        rules.append(f"{name} ::= " + " | ".join(" ".join(sequence) or '""' for sequence in alternatives))
    return "\n".join(rules) + "\n"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(grammar=grammars())
def test_generated_grammars_are_answered_or_refused_and_the_neighbour_goes_on(
        grammar_server: RunningServer, alone: float, grammar: str) -> None:
    response, took = beside_a_neighbour(grammar_server, {"prompt": "x", "max_tokens": 4, "grammar": grammar})
    assert response.status_code in (200, 400), f"{grammar}\n{response.status_code} {response.text[:300]}"
    if response.status_code == 400:
        assert_envelope(400, response.content, grammar)
    logger.info("generated grammar: %s -> %s; neighbour %.2f s (alone %.2f s)", grammar.replace("\n", " / "),
                response.status_code, took, alone)
    assert_neighbour_unhurt(took, alone, grammar)
    assert grammar_server.process.poll() is None, grammar
