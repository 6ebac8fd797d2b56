"""Sampling on the engine thread: each sequence's sampler (a greedy fast path or a native chain), the lazy
grammar check, and log-probabilities, all read from the logits of the last `llama_decode`."""

from __future__ import annotations

import ctypes
import random
import time
from collections.abc import Callable

import numpy as np

from edge_llm.engine.llama.bindings import llama_cpp
from edge_llm.engine.grammar.compiled import CompiledGrammars
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.llama.greedy import GreedyPicker
from edge_llm.engine.types import GrammarTooCostly, SamplingExhausted, SamplingParams, TokenLogprob


class Sampler:
    """One sequence's sampling state: the greedy fast path or a native chain, and its grammar apart.

    The grammar is kept out of the chain so that it can be checked lazily (see `TokenSampling.sample`)
    and so that no token it rejects ever reaches its `accept`, which throws a C++ exception
    (fatal across ctypes) on a token the grammar does not allow.
    """

    def __init__(self, *, picker: GreedyPicker | None = None, chain: llama_cpp.llama_sampler_p | None = None,
                 grammar: llama_cpp.llama_sampler_p | None = None) -> None:
        self.picker = picker
        self.chain = chain
        self.grammar = grammar

    def close(self) -> None:
        for handle in (self.chain, self.grammar):
            if handle is not None:
                llama_cpp.llama_sampler_free(handle)
        self.chain = self.grammar = None

    def __del__(self) -> None:
        self.close()


# At temperature 0 a token the grammar rejects is replaced by the likeliest one it allows: usually among the
# likeliest few, so those are checked first (a fraction of a millisecond) before the whole vocabulary (tens).
GRAMMAR_SHORTLIST = 64

# llama_token_data: {int32 id; float logit; float p}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])

# A grammar's pass over the whole vocabulary costs (parse stacks × tokens): it runs in slices of this many tokens,
# with the step budget checked between them, so that a costly grammar ends its own request instead of holding
# every other sequence's step (the grammar masks each token on its own: slices give the same result).
GRAMMAR_SLICE = 4096


class _Candidates:
    """A reusable llama_token_data_array of `n` candidates (the whole vocabulary, a shortlist, one token)."""

    def __init__(self, n: int) -> None:
        self.data = np.zeros(n, dtype=_TOKEN_DATA)
        self._ids = np.arange(n, dtype=np.int32)
        self.array = llama_cpp.llama_token_data_array(
            data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p), size=n, selected=-1, sorted=False)
        self.pointer = ctypes.pointer(self.array)

    def fill(self, logits: np.ndarray | float, ids: np.ndarray | int | None = None) -> None:
        """Token ids (by default 0..n-1, for a row of logits) and their logits."""
        # Samplers sort and shrink the array in place: every use starts from a fresh copy in token order.
        self.data["id"] = self._ids if ids is None else ids
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.array.size = len(self.data)
        self.array.selected = -1
        self.array.sorted = False

    def selected(self) -> tuple[int, float] | None:
        """The chosen token and its logit after the samplers ran, or None when nothing was chosen."""
        index = self.array.selected
        if not 0 <= index < self.array.size:
            return None
        entry = self.array.data[index]
        return int(entry.id), float(entry.logit)


class TokenSampling:
    """Creates the samplers of one context's sequences and draws their tokens (engine thread only)."""

    def __init__(self, ctx: llama_cpp.llama_context_p, n_vocab: int, end_tokens: tuple[int, ...],
                 grammars: CompiledGrammars, piece: Callable[[int], bytes], *,
                 grammar_step_budget: float = 1.0) -> None:
        self._ctx = ctx
        self._grammar_step_budget = grammar_step_budget
        self._n_vocab = n_vocab
        self._end_tokens = end_tokens
        self._grammars = grammars
        self._piece = piece
        self._candidates = _Candidates(n_vocab)
        self._single = _Candidates(1)
        self._shortlist = _Candidates(GRAMMAR_SHORTLIST)

    def _logit_bias(self, params: SamplingParams) -> tuple[tuple[int, float], ...]:
        if not params.ignore_eos:
            return params.logit_bias
        banned = {token: float("-inf") for token in self._end_tokens}
        return tuple({**dict(params.logit_bias), **banned}.items())

    def new_sampler(self, params: SamplingParams) -> Sampler:
        penalized = params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
        logit_bias = self._logit_bias(params)
        grammar = None
        if params.grammar is not None:
            grammar = self._grammars.instance(params.grammar)  # a clone of the one check_grammar compiled
            if grammar is None:
                raise GrammarError("llama.cpp rejected the grammar")
        if params.greedy and not penalized:
            return Sampler(picker=GreedyPicker(logit_bias), grammar=grammar)
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        add = llama_cpp.llama_sampler_chain_add
        if logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(logit_bias))()
            for i, (token, bias) in enumerate(logit_bias):
                biases[i].token = token
                biases[i].bias = bias
            add(chain, llama_cpp.llama_sampler_init_logit_bias(self._n_vocab, len(logit_bias), biases))
        if penalized:
            add(
                chain,
                llama_cpp.llama_sampler_init_penalties(
                    self._n_vocab, 64, params.repeat_penalty, params.frequency_penalty, params.presence_penalty
                ),
            )
        if params.greedy:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = params.seed if params.seed is not None else random.getrandbits(32)
            add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return Sampler(chain=chain, grammar=grammar)

    def sample(self, sampler: Sampler, batch_index: int) -> int:
        """The next token of one sequence. Under a grammar, llama.cpp's common-sampler scheme: sample as if
        unconstrained, check that one token against the grammar, and only when it is rejected apply the
        grammar to the whole vocabulary and sample again (at temperature 0 the same token as grammar-first;
        most tokens pass, so the 151,936-candidate grammar pass is rare). Raises `SamplingExhausted` when no
        token may follow; a token the grammar rejects is never accepted into it."""
        if sampler.grammar is None:
            if sampler.picker is not None:
                return sampler.picker.pick(self._logits(batch_index))
            return int(llama_cpp.llama_sampler_sample(sampler.chain, self._ctx, batch_index))
        logits = self._logits(batch_index)
        started = time.perf_counter()
        token = self._pick(sampler, logits, constrained=False)
        if token is None or not self._grammar_allows(sampler.grammar, token):
            token = self._pick(sampler, logits, constrained=True, started=started)
            if token is None:
                raise self._exhausted(sampler.grammar)
        llama_cpp.llama_sampler_accept(sampler.grammar, token)
        if sampler.chain is not None:
            llama_cpp.llama_sampler_accept(sampler.chain, token)
        return token

    def _pick(self, sampler: Sampler, logits: np.ndarray, *, constrained: bool,
              started: float | None = None) -> int | None:
        """One draw of the sequence's sampler (the chain is applied, not accepted); None when every candidate
        is banned (-inf) by the grammar (when `constrained`) and logit_bias together."""
        picker = sampler.picker
        if not constrained and picker is not None:
            token = picker.pick(logits)
            return None if picker.biased_logit(logits, token) == -np.inf else token
        if picker is not None and (token := self._likeliest_allowed(sampler, picker, logits)) is not None:
            return token
        candidates = self._candidates
        candidates.fill(logits)
        if constrained:
            self._mask_in_slices(sampler.grammar, candidates, time.perf_counter() if started is None else started)
        if picker is not None:
            masked = candidates.data["logit"]  # token order: the grammar masks, it does not sort
            token = picker.pick(masked)
            return None if picker.biased_logit(masked, token) == -np.inf else token
        llama_cpp.llama_sampler_apply(sampler.chain, candidates.pointer)
        chosen = candidates.selected()
        return None if chosen is None or chosen[1] == -np.inf else chosen[0]

    def _likeliest_allowed(self, sampler: Sampler, picker: GreedyPicker, logits: np.ndarray) -> int | None:
        """Greedy under the grammar from the GRAMMAR_SHORTLIST likeliest tokens: the first one the grammar allows
        is the whole vocabulary's pick, unless it ties with a token left out. None: the caller checks them all."""
        ids, values = picker.likeliest(logits, GRAMMAR_SHORTLIST)
        self._shortlist.fill(values, ids)
        llama_cpp.llama_sampler_apply(sampler.grammar, self._shortlist.pointer)  # masks (-inf), never reorders
        allowed = np.flatnonzero(self._shortlist.data["logit"] != -np.inf)
        if not allowed.size or values[allowed[0]] <= values[-1]:
            return None
        return int(ids[allowed[0]])

    def _mask_in_slices(self, grammar: llama_cpp.llama_sampler_p, candidates: _Candidates, started: float) -> None:
        """The grammar's mask over every candidate, a slice at a time; raises GrammarTooCostly past the budget."""
        base = candidates.data.ctypes.data
        total = len(candidates.data)
        for start in range(0, total, GRAMMAR_SLICE):
            piece = llama_cpp.llama_token_data_array(
                data=ctypes.cast(base + start * _TOKEN_DATA.itemsize, llama_cpp.llama_token_data_p),
                size=min(GRAMMAR_SLICE, total - start), selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(grammar, ctypes.byref(piece))
            spent = time.perf_counter() - started
            if spent > self._grammar_step_budget and start + GRAMMAR_SLICE < total:
                raise GrammarTooCostly(
                    f"the grammar is too costly: checking the vocabulary against it took over "
                    f"{self._grammar_step_budget * 1000:.0f} ms in one step ({start + GRAMMAR_SLICE} of {total} "
                    "tokens checked); simplify it (fewer alternatives that can match the same text)")

    def _grammar_allows(self, grammar: llama_cpp.llama_sampler_p, token: int) -> bool:
        self._single.fill(1.0, token)
        llama_cpp.llama_sampler_apply(grammar, self._single.pointer)
        return bool(self._single.data["logit"][0] != -np.inf)

    def _exhausted(self, grammar: llama_cpp.llama_sampler_p) -> SamplingExhausted:
        if self._end_tokens and self._grammar_allows(grammar, self._end_tokens[0]):
            # The grammar is complete and only an end token may follow, but end tokens are banned (ignore_eos
            # or logit_bias): the answer is over.
            return SamplingExhausted("the grammar is complete", complete=True)
        return SamplingExhausted("logit_bias bans every token the grammar allows at this point", complete=False)

    def _logits(self, batch_index: int) -> np.ndarray:
        """The logits of one batch position, viewed in place (valid until the next decode)."""
        pointer = llama_cpp.llama_get_logits_ith(self._ctx, batch_index)
        return np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))

    def logprobs(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        """The model's log-probability of `token` and of its `top_n` likeliest alternatives (raw logits)."""
        logits = self._logits(batch_index)
        peak = float(logits.max())
        log_total = peak + float(np.log(np.exp(logits - peak).sum()))
        top: tuple[tuple[int, bytes, float], ...] = ()
        if top_n > 0:
            best = np.argpartition(logits, -top_n)[-top_n:]
            best = best[np.argsort(logits[best])[::-1]]
            top = tuple((int(t), self._piece(int(t)), float(logits[t]) - log_total) for t in best)
        return TokenLogprob(token, self._piece(token), float(logits[token]) - log_total, top)
