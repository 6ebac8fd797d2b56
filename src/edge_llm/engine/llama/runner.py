"""The model and its generation context: loading, model facts, tokenization, batched decode, KV ops.

`LlamaRunner` is owned by the engine thread. Its vocabulary functions (`tokenize`,
`detokenize`) only read the vocabulary and are also safe from the tokenizer thread.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_llm.engine.llama.bindings import llama_cpp
from edge_llm.engine.grammar.compiled import CompiledGrammars
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.grammar.gbnf.tokens import TokenTexts
from edge_llm.engine.grammar.limits import check_grammar_limits
from edge_llm.engine.thread.embeddings import EMBEDDING_MAX_TOKENS
from edge_llm.engine.llama.kv_types import KV_TYPES
from edge_llm.engine.llama.embedding import EmbeddingContext
from edge_llm.engine.llama.kv_state import read_sequence_state, write_sequence_state
from edge_llm.engine.llama.model_facts import embeds_in_chunks, fim_tokens, model_metadata
from edge_llm.engine.llama.loading import STRLEN_ADDRESS, ModelLoadError, create_context, expected_failure, load_model
from edge_llm.engine.llama.loading import model_params
from edge_llm.engine.llama.sampling import Sampler, TokenSampling
from edge_llm.engine.llama.vocabulary import grammar_token_texts, piece, scan_vocabulary, special_text
from edge_llm.engine.scheduling.step_plan import KvCopy, KvOp, KvRemove, KvShift, KvTrim
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.types import (
    ModelInfo,
    OutOfCellsError,
    SamplingParams,
    StepAbortedError,
    TokenLogprob,
)

logger = logging.getLogger(__name__)
class DecodeError(RuntimeError):
    def __init__(self, code: int) -> None:
        super().__init__(f"llama_decode failed with code {code}")
        self.code = code


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    cache_type_k: str = "f16"  # engine/llama/kv_types.py
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # auto | on | off
    logit_rows: int = 0  # the most rows of logits a step asks for (config.logit_rows): written once at load
    # --deterministic: one KV stream per sequence, no repacked weights, ggml's tiled matmul off (docs/determinism.md);
    # the settings make the KV cache quantized and flash attention on
    deterministic: bool = False
    grammar_step_budget: float = 1.0  # seconds one sequence's grammar may take in one step (config.py)


_FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


# llama.cpp asks an abort callback after every node of a decode's graph (on its first compute thread). A Python callback
# would take the GIL hundreds of times a step; libc's strlen on a two-byte flag is the same test in C: true once the
# flag's first byte is set (`abort_step`), false while it is 0.
_ABORT_CHECK = llama_cpp.ggml_abort_callback(STRLEN_ADDRESS)


# ggml-cpu's tiled K-quant matmul (8 rows and more) rounds otherwise than its kernels for fewer rows, so a row's
# logits would depend on how many rows its step has. ggml reads the switch once, at its first matrix product: the
# runner sets it before its first decode, and it holds for the process (--deterministic is server-wide).
_TILED_MATMUL_SWITCH = "GGML_CPU_TILED_MM"


def _context_params(config: ContextConfig) -> llama_cpp.llama_context_params:
    ctx_params = llama_cpp.llama_context_default_params()
    ctx_params.n_ctx = config.n_ctx
    ctx_params.n_batch = config.n_batch
    ctx_params.n_ubatch = min(config.n_batch, 512)
    ctx_params.n_seq_max = config.n_seq_max
    if config.logit_rows > 0:
        # llama.cpp sizes its worst-case graph for n_outputs_max rows of logits (n_batch by default: 300 MiB of
        # compute buffer on the default model, most of it never used) and aborts a batch that asks for more.
        ctx_params.n_outputs_max = max(config.logit_rows, config.n_seq_max)
    ctx_params.n_threads = config.n_threads
    ctx_params.n_threads_batch = config.n_threads_batch
    # One stream for every sequence shares cells (a prefix copy costs nothing); a stream per sequence keeps each
    # sequence's cells in position order, which attention sums in (--deterministic).
    ctx_params.kv_unified = not config.deterministic
    ctx_params.no_perf = True
    # (a quantized V with flash attention off is refused by the settings; llama.cpp turns auto on for it)
    ctx_params.type_k = KV_TYPES[config.cache_type_k].ggml_type
    ctx_params.type_v = KV_TYPES[config.cache_type_v].ggml_type
    ctx_params.flash_attn_type = _FLASH_ATTN[config.flash_attn]
    return ctx_params


class LlamaRunner:
    def __init__(self, model_path: Path, config: ContextConfig, model: llama_cpp.llama_model_p | None = None) -> None:
        """`model`: the file already loaded with model_params(deterministic=config.deterministic) (EarlyLoad), which
        the runner then owns."""
        self.config = config
        self.model_path = model_path
        if config.deterministic:
            os.environ[_TILED_MATMUL_SWITCH] = "0"
        self._model = model or load_model(model_path, model_params(deterministic=config.deterministic))
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        # The vocabulary pass (Python, ~0.2 s of CPU on a 150k vocabulary) runs beside the context's creation, which
        # is C work without the GIL: start-up is shorter by about that much (issue 40).
        with ThreadPoolExecutor(1, thread_name_prefix="edge-llm-vocabulary") as pool:
            scan = pool.submit(scan_vocabulary, self._vocab, self._n_vocab)
            self._ctx = create_context(self._model, _context_params(config))
            vocabulary = scan.result()
        self._end_tokens, self._control = vocabulary.end_tokens, vocabulary.control
        self._longest_token = vocabulary.longest_piece
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise ModelLoadError(
                f"llama.cpp could not create a context of {config.n_ctx} tokens with a KV cache of K "
                f"{config.cache_type_k} and V {config.cache_type_v} (not enough memory, or cache types this model "
                "does not support: see the lines of edge_llm.llama_cpp above)"
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._abort_flag = ctypes.create_string_buffer(2)
        llama_cpp.llama_set_abort_callback(self._ctx, _ABORT_CHECK, ctypes.cast(self._abort_flag, ctypes.c_void_p))
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        self._grammars = CompiledGrammars(self._compile_grammar, llama_cpp.llama_sampler_clone,
                                          llama_cpp.llama_sampler_free)
        self._sampling = TokenSampling(self._ctx, self._n_vocab, self._end_tokens, self._grammars, self.piece,
                                       grammar_step_budget=config.grammar_step_budget)
        self.info = self._read_info()
        self._embedding: EmbeddingContext | None = None
        self._batch_row: list[int] | None = None  # plan row → batch row, when decode reorders them
        # The token texts the grammar check walks (0.2-0.5 s of CPU and ~7 MB for 150k tokens): read by the first
        # grammar check, as llama-server pays nothing for them at load; a server never asked for a grammar never
        # builds them, and the start-up does not share the CPU and the GIL with them (issue 40).
        self._grammar_tokens: TokenTexts | None = None
        self._grammar_tokens_lock = threading.Lock()
        self._reserve_outputs(min(config.logit_rows, config.n_batch, config.n_ctx))


    def _reserve_outputs(self, rows: int) -> None:
        """llama.cpp grows its output buffer to the largest step's rows of logits, and its pages count once written:
        without this a server's memory would creep up to them while it serves (the soak saw ~10 MiB per 100 requests
        with drafting). A decode of `rows` rows stopped at its first graph node grows the buffer (it is sized before
        the graph runs, and llama.cpp clears a new buffer, which makes its pages resident now): the cost of the full
        decode (0.5 s on the default model, the output projection of every row) is not paid at start-up. Then one
        token warms the weights and the thread pool, as llama-server's warm-up does."""
        if rows > 0:
            plan = StepPlan()
            for position in range(rows):
                plan.add(0, position, 0, True)
            self.abort_step()
            try:
                with expected_failure():
                    self.decode(plan)
            except StepAbortedError:
                pass
            finally:
                self.arm_abort()
            self.clear_kv()
        warm_up = StepPlan()
        warm_up.add(self.info.bos_token if self.info.bos_token is not None else 0, 0, 0, True)
        self.decode(warm_up)
        self.clear_kv()

    # ---- model facts -----------------------------------------------------------------

    def _read_info(self) -> ModelInfo:
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buffer, len(buffer))
        template = llama_cpp.llama_model_chat_template(self._model, None)
        bos = llama_cpp.llama_vocab_bos(self._vocab)
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        metadata = model_metadata(self._model)
        return ModelInfo(
            path=self.model_path,
            description=buffer.value.decode("utf-8", errors="replace"),
            n_params=llama_cpp.llama_model_n_params(self._model),
            size_bytes=llama_cpp.llama_model_size(self._model),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(self._model),
            n_vocab=self._n_vocab,
            chat_template=template.decode("utf-8", errors="replace") if template else None,
            bos_text=self._special_text(bos),
            eos_text=self._special_text(eos),
            add_bos=add_bos,
            bos_token=bos if add_bos and bos >= 0 else None,
            metadata=metadata,
            fim=fim_tokens(self._vocab, self._n_vocab),
            # (a moved chunk keeps values computed after other text: not what --deterministic promises)
            can_move_cells=bool(llama_cpp.llama_memory_can_shift(self._memory)) and not self.config.deterministic,
            embedding_dimensions=llama_cpp.llama_model_n_embd_out(self._model) if embeds_in_chunks(self._model, metadata) else 0,
            embedding_max_tokens=min(EMBEDDING_MAX_TOKENS, self.config.n_ctx,
                                     max(1, llama_cpp.llama_model_n_ctx_train(self._model))),
            control_tokens=self._control,
            max_token_bytes=self._longest_token,
            end_tokens=tuple(self._end_tokens),
        )

    def _special_text(self, token: int) -> str:
        return special_text(self._vocab, token)

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    # ---- vocabulary (thread-safe: read-only) -------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        capacity = len(data) + 8
        tokens = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if count < 0:
            capacity = -count
            tokens = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), tokens, capacity, add_special, parse_special
            )
        return list(tokens[:count])

    def detokenize(self, tokens: list[int]) -> str:
        array = (llama_cpp.llama_token * len(tokens))(*tokens)
        capacity = max(64, len(tokens) * 8)
        buffer = ctypes.create_string_buffer(capacity)
        n = llama_cpp.llama_detokenize(self._vocab, array, len(tokens), buffer, capacity, False, False)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_detokenize(self._vocab, array, len(tokens), buffer, -n, False, False)
        return buffer.raw[:n].decode("utf-8", errors="replace")

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes as the vocabulary spells it (control tokens by their text)."""
        return [self._piece(token, special=True) for token in tokens]

    def is_valid_token(self, token: int) -> bool:
        return 0 <= token < self._n_vocab

    # ---- engine thread only ------------------------------------------------------------

    def piece(self, token: int) -> bytes:
        """The bytes a generated token adds to the output (special tokens add nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._piece(token, special=False)
        return cached

    def _piece(self, token: int, *, special: bool) -> bytes:
        return piece(self._vocab, token, special=special)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def apply_kv_ops(self, ops: list[KvOp]) -> None:
        for op in ops:
            if isinstance(op, KvRemove):
                llama_cpp.llama_memory_seq_rm(self._memory, op.seq_id, -1, -1)
            elif isinstance(op, KvCopy):
                self._copy(op)
            elif isinstance(op, KvTrim):
                llama_cpp.llama_memory_seq_rm(self._memory, op.seq_id, op.start, op.end)
            elif isinstance(op, KvShift):
                llama_cpp.llama_memory_seq_add(self._memory, op.seq_id, op.start, op.end, op.delta)

    def _copy(self, op: KvCopy) -> None:
        if not self.config.deterministic:
            llama_cpp.llama_memory_seq_cp(self._memory, op.src_seq, op.dst_seq, op.start, op.end)
            return
        # Between streams llama.cpp copies only whole streams (a partial range aborts the process): the whole source
        # stream's data, at the next decode, then the positions past the copied range let go.
        if op.start != 0:
            raise ValueError("a range copy between KV streams (a moved chunk) cannot be made with --deterministic")
        llama_cpp.llama_memory_seq_cp(self._memory, op.src_seq, op.dst_seq, -1, -1)
        llama_cpp.llama_memory_seq_rm(self._memory, op.dst_seq, op.end, -1)

    def save_sequence_state(self, seq_id: int) -> bytearray:
        """A copy of `seq_id`'s KV state, for the persistent prefix cache."""
        return read_sequence_state(self._ctx, seq_id)

    def load_sequence_state(self, seq_id: int, data: bytes) -> bool:
        """Restores saved KV state into the empty `seq_id`; False when llama.cpp refuses it."""
        return write_sequence_state(self._ctx, seq_id, data)

    def clear_kv(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)

    def decode(self, plan: StepPlan) -> None:
        batch = self._batch
        n = len(plan.tokens)
        order = range(n)
        if self.config.deterministic:
            # With a stream per sequence, llama.cpp puts only runs of consecutive sequence ids in one micro-batch
            # (each micro-batch reads all the weights): the rows go in seq id order. `_batch_row` maps a plan row to
            # its batch row for the logits.
            order = sorted(order, key=plan.seq_ids.__getitem__)
            self._batch_row = [0] * n
            for row, i in enumerate(order):
                self._batch_row[i] = row
        for row, i in enumerate(order):
            batch.token[row] = plan.tokens[i]
            batch.pos[row] = plan.positions[i]
            batch.n_seq_id[row] = 1
            batch.seq_id[row][0] = plan.seq_ids[i]
            batch.logits[row] = plan.logits[i]
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code == 1:
            raise OutOfCellsError("no KV cells free for this batch")
        if code == 2:
            raise StepAbortedError("the decode was stopped: every request in it was cancelled")
        if code != 0:
            raise DecodeError(code)

    def arm_abort(self) -> None:
        """The next decode runs to its end unless `abort_step` is called (engine thread, before the decode)."""
        self._abort_flag[0] = 0

    def abort_step(self) -> None:
        """Stops the decode in progress at its next graph node (any thread); it raises StepAbortedError."""
        self._abort_flag[0] = 1

    def _compile_grammar(self, grammar: str) -> llama_cpp.llama_sampler_p | None:
        handle = llama_cpp.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")
        return handle or None

    def check_grammar(self, grammar: str) -> None:
        """Checks the limits and compiles a grammar into the cache that `new_sampler` clones from (vocabulary
        only: safe off the engine thread). Every grammar a request brings passes here before the engine gets it."""
        check_grammar_limits(grammar, self._token_texts())
        if not self._grammars.add(grammar):
            raise GrammarError("llama.cpp rejected the grammar")

    def _token_texts(self) -> TokenTexts:
        with self._grammar_tokens_lock:  # two first grammars at once build them once
            if self._grammar_tokens is None:
                self._grammar_tokens = grammar_token_texts(self._vocab, self._n_vocab)
            return self._grammar_tokens

    # ---- sampling (TokenSampling, engine thread only) -----------------------------------------------

    def new_sampler(self, params: SamplingParams) -> Sampler:
        return self._sampling.new_sampler(params)

    def sample(self, sampler: Sampler, batch_index: int) -> int:
        return self._sampling.sample(sampler, self._batch_row[batch_index] if self._batch_row else batch_index)

    def logprobs(self, batch_index: int, token: int, top_n: int) -> TokenLogprob:
        row = self._batch_row[batch_index] if self._batch_row else batch_index
        return self._sampling.logprobs(row, token, top_n)

    # ---- embeddings (engine thread only) -------------------------------------------------------------

    def hidden_states(self, tokens: list[int], start: int) -> np.ndarray:
        """Hidden states of one chunk of an embedding input (see embedding.py); the embedding context is made on
        first use. Raises EmbeddingUnavailableError when it cannot be."""
        if self._embedding is None:
            self._embedding = EmbeddingContext(self._model, max_tokens=self.info.embedding_max_tokens,
                                               n_threads=self.config.n_threads,
                                               n_threads_batch=self.config.n_threads_batch)
        return self._embedding.hidden_states(tokens, start)

    def close(self) -> None:
        with self._grammar_tokens_lock:  # waits for a grammar's first check: it reads the vocabulary freed here
            self._grammars.close()
            if self._embedding is not None:
                self._embedding.close()
                self._embedding = None
            if self._ctx:
                llama_cpp.llama_batch_free(self._batch)
                llama_cpp.llama_free(self._ctx)
                self._ctx = None
            if self._model:
                llama_cpp.llama_model_free(self._model)
                self._model = None
