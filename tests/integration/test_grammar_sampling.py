"""Grammar-constrained sampling on the real model, in process: the lazy check (sample, check that one token,
resample under the grammar only when it is rejected; greedy resamples from the likeliest few tokens first)
picks, token for token, what llama.cpp's grammar-first chain picks at temperature 0 — with and without a penalty
in the chain and a logit_bias. And the grammar check with this model's vocabulary."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.tokens import TokenTexts
from edge_llm.engine.llama import runner as runner_module
from edge_llm.engine.llama.runner import ContextConfig, LlamaRunner
from edge_llm.engine.llama.schema_grammar import json_schema_to_grammar
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.types import SamplingParams
from edge_llm.prompting.tools import forced_call_grammar
from edge_llm.testing.server import MODEL, THREADS

SCHEMAS = {
    "object": {"type": "object"},
    "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}},
               "required": ["name", "age", "tags"]},
    "list of numbers": {"type": "array", "items": {"type": "number"}, "minItems": 3},
    # Values the model would never write: the shortlist of the likeliest tokens holds none of them, so the greedy
    # resample falls back to the pass over the whole vocabulary.
    "unlikely enum": {"type": "object", "properties": {"code": {"enum": ["qxzvj", "wkpfy"]}, "n": {"type": "integer"}},
                      "required": ["code", "n"]},
}
PROMPT = ("<|im_start|>user\nDescribe a person called Ada who is 36, as JSON with name, age and tags."
          "<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def runner() -> Iterator[LlamaRunner]:
    runner = LlamaRunner(MODEL, ContextConfig(n_ctx=1024, n_batch=512, n_seq_max=1, n_threads=THREADS, n_threads_batch=THREADS))
    yield runner
    runner.close()


def grammar_first_chain(runner: LlamaRunner, params: SamplingParams) -> llama_cpp.llama_sampler_p:
    """What the engine sampled with before the lazy check: grammar first, then bias, penalties, greedy."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    vocab = llama_cpp.llama_model_get_vocab(runner._model)  # noqa: SLF001 - the reference needs llama.cpp's handles
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_grammar(vocab, params.grammar.encode(),
                                                                                  b"root"))
    if params.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
        for i, (token, bias) in enumerate(params.logit_bias):
            biases[i].token, biases[i].bias = token, bias
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(
            runner.n_vocab, len(params.logit_bias), biases))
    if params.repeat_penalty != 1.0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(
            runner.n_vocab, 64, params.repeat_penalty, 0.0, 0.0))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return chain


CASES = {
    "person, greedy": ("person", {}),
    "numbers, greedy": ("list of numbers", {}),
    "unlikely enum, greedy": ("unlikely enum", {}),
    "object, penalty chain": ("object", {"repeat_penalty": 1.3}),
    "person, logit_bias": ("person", {"logit_bias": ((90, -100.0), (4913, 3.0))}),
}


@pytest.mark.parametrize(("schema", "extra"), list(CASES.values()), ids=list(CASES))
def test_the_lazy_grammar_check_picks_what_grammar_first_picks(runner: LlamaRunner, schema: str,
                                                                extra: dict) -> None:
    params = SamplingParams(temperature=0.0, grammar=json_schema_to_grammar(SCHEMAS[schema]), **extra)
    lazy = runner.new_sampler(params)
    reference = grammar_first_chain(runner, params)
    runner.clear_kv()
    prompt = runner.tokenize(PROMPT, add_special=False, parse_special=True)
    plan = StepPlan()
    for position, token in enumerate(prompt):
        plan.add(token, position, 0, position == len(prompt) - 1)
    runner.decode(plan)
    index, position, picked = len(prompt) - 1, len(prompt), []
    try:
        for _ in range(64):
            token = runner.sample(lazy, index)
            expected = llama_cpp.llama_sampler_sample(reference, runner._ctx, index)  # noqa: SLF001 - the reference
            assert token == expected, (picked, runner.detokenize(picked))
            picked.append(token)
            if runner.is_end_of_generation(token):
                break
            step = StepPlan()
            index = step.add(token, position, 0, True)
            runner.decode(step)
            position += 1
    finally:
        lazy.close()
        llama_cpp.llama_sampler_free(reference)
    assert len(picked) >= 8, runner.detokenize(picked)


def grammar_refusal(runner: LlamaRunner, grammar_text: str, tokens: list[int]) -> int | None:
    """The first of `tokens`, then the end token, that llama.cpp's grammar sampler refuses (None: all let through),
    each accepted into the grammar before the next."""
    vocab = llama_cpp.llama_model_get_vocab(runner._model)  # noqa: SLF001
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode(), b"root")
    one = (llama_cpp.llama_token_data * 1)()
    array = llama_cpp.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
    end = llama_cpp.llama_vocab_eos(vocab)
    try:
        for token in [*tokens, end]:
            one[0].id, one[0].logit, array.size = token, 1.0, 1
            llama_cpp.llama_sampler_apply(grammar, ctypes.pointer(array))
            if one[0].logit == float("-inf"):
                return token
            if token != end:
                llama_cpp.llama_sampler_accept(grammar, token)
        return None
    finally:
        llama_cpp.llama_sampler_free(grammar)


def test_json_grammars_let_the_model_indent_as_llama_server_does(runner: LlamaRunner) -> None:
    """The JSON grammars take llama.cpp's whitespace rule (a line break and indentation between tokens), not only
    one optional space: an indented answer, the way this model writes JSON, is allowed token by token, and the end
    is reached."""
    # (no space after an enum value, in llama.cpp's converter as in llama-cpp-python's)
    text = '{\n  "name": "Ada",\n  "age": 36,\n  "tags": [\n    "a",\n    "c"]\n}'
    refused = grammar_refusal(runner, json_schema_to_grammar(SCHEMAS["person"]),
                              runner.tokenize(text, add_special=False, parse_special=False))
    assert refused is None, f"the grammar refused {runner.detokenize([refused])!r}"


def values_taken(runner: LlamaRunner, bounds: dict, values: tuple[str, ...]) -> dict[str, bool]:
    """For each value, whether llama.cpp's grammar for {"v": <a value within `bounds`>} takes it, fed one token a
    character (so a refusal falls on the digit that breaks the bound)."""
    grammar = json_schema_to_grammar({"type": "object", "properties": {"v": bounds}, "required": ["v"]})

    def taken(value: str) -> bool:
        tokens = [runner.tokenize(c, add_special=False, parse_special=False)[0] for c in f'{{"v": {value}}}']
        return grammar_refusal(runner, grammar, tokens) is None

    return {value: taken(value) for value in values}


def test_an_integer_schema_keeps_its_bounds_in_llama_cpps_grammar(runner: LlamaRunner) -> None:
    inside, outside = ("-3", "-1", "0", "7", "10", "99", "119"), ("-4", "120", "200", "1000", "-10", "007", "-0")
    taken = values_taken(runner, {"type": "integer", "minimum": -3, "exclusiveMaximum": 120}, inside + outside)
    assert [v for v in inside if not taken[v]] == [] and [v for v in outside if taken[v]] == []


def test_a_number_schema_keeps_its_bounds_in_llama_cpps_grammar(runner: LlamaRunner) -> None:
    inside = ("-1.5", "-1.25", "-1", "-0.5", "0", "0.0", "1", "2", "2.2", "2.2499")
    outside = ("-1.51", "-2", "2.25", "2.5", "3", "-0", "1e0", "02")
    taken = values_taken(runner, {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25}, inside + outside)
    assert [v for v in inside if not taken[v]] == [] and [v for v in outside if taken[v]] == []


def test_a_pattern_with_escaped_regex_characters_is_a_grammar_llama_cpp_takes(runner: LlamaRunner) -> None:
    """`\\.`, `\\^` and `\\$` in a schema `pattern` are those characters, as llama.cpp's converter reads them
    (llama-cpp-python's wrote `"\\."`, which GBNF refuses: a 400 for every version or e-mail pattern)."""
    grammar = json_schema_to_grammar({"type": "string", "pattern": r"^v[0-9]+\.[0-9]+\^\$$"})
    runner.check_grammar(grammar)

    def taken(value: str) -> bool:
        tokens = [runner.tokenize(c, add_special=False, parse_special=False)[0] for c in f'"{value}"']
        return grammar_refusal(runner, grammar, tokens) is None

    assert [v for v in ("v1.2^$", "v10.25^$") if not taken(v)] == []
    assert [v for v in ("v1x2^$", "v1.2", "v1.2\\^$", "v.2^$") if taken(v)] == []


def test_the_ambiguity_check_reads_this_models_vocabulary(runner: LlamaRunner) -> None:
    """With the model's own token texts (runner.check_grammar, as every request's grammar): llama.cpp's example
    grammars, the converter's grammars, a forced tool call and an enum of 2 000 values pass; `(" " | " ")*`, which
    held llama.cpp over 60 s for one pass over this vocabulary (its tokens of spaces then a newline are walked
    once per split), is refused naming its rule."""
    fixtures = sorted((Path(__file__).parents[1] / "fixtures" / "gbnf").glob("*.gbnf"))
    grammars = [path.read_text(encoding="utf-8") for path in fixtures]
    grammars += [json_schema_to_grammar(schema) for schema in SCHEMAS.values()]
    grammars.append(json_schema_to_grammar({"enum": [f"value {i}" for i in range(2000)]}))
    grammars.append(forced_call_grammar([{"name": "describe", "parameters": SCHEMAS["person"]},
                                         {"name": "sum", "parameters": SCHEMAS["list of numbers"]}],
                                        json_schema_to_grammar))
    for grammar in grammars:
        runner.check_grammar(grammar)
    with pytest.raises(GrammarError, match="grammar rule 'root' is ambiguous"):
        runner.check_grammar('root ::= (" " | " ")*')


def test_the_token_texts_are_built_by_the_first_grammar_check_not_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server reads nothing of the vocabulary for grammars at load: the grammar check's token texts (0.2-0.5 s
    of CPU, ~7 MB on this vocabulary) are built once, by the first grammar check, in the thread that asks it —
    not by a thread started at load, which shared the CPU and the GIL with the start-up (issue 40)."""
    builders: list[str] = []
    build = runner_module.grammar_token_texts

    def counted(vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> TokenTexts:
        builders.append(threading.current_thread().name)
        return build(vocab, n_vocab)

    monkeypatch.setattr(runner_module, "grammar_token_texts", counted)
    fresh = LlamaRunner(MODEL, ContextConfig(n_ctx=256, n_batch=64, n_seq_max=1, n_threads=THREADS, n_threads_batch=THREADS))
    try:
        fresh.check_grammar('root ::= "yes" | "no"')
        fresh.check_grammar('root ::= [0-9]+')
    finally:
        fresh.close()
    assert builders == [threading.current_thread().name]
