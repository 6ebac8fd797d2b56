"""What the HTTP side may ask of the engine, in one place: `EngineClient`.

The API layer talks to the engine only through this class (and the plain data in `engine.types`):

- generation: `submit` a request's choices on one reply channel, `abort` one (a long prefill's progress goes to the
  channel's `on_progress`);
- embeddings: `submit_embedding` (its answer is one `Embedded` on the channel), `abort`;
- vocabulary: `tokenize`, `detokenize`, `is_valid_token`, `n_vocab`;
- model facts: `model_info`;
- grammar: `check_grammar`, `json_schema_to_grammar` (both raise `GrammarError`);
- health: `loaded`, `alive`, `ready`, `failed`, `error`, `readiness()`, `stats()`;
- lifecycle: `start`, `wait_loaded`, `on_exit`, `set_observer`, and `close()`, the one way to end it all.

Vocabulary and grammar work reads the model but never runs on the engine thread: it runs in the tokenizer
thread (`in_tokenizer_thread`), so neither the event loop nor the engine waits on it. The work of a large request
(a megabyte prompt takes seconds to tokenize) runs in a second one (`in_bulk_thread`), so that ordinary requests
never queue behind it. Both are closed (queued work still finishes) before the engine thread frees the model,
whichever way the engine ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, cast

from edge_llm.engine.thread.channel import ReplyChannel
from edge_llm.engine.grammar.errors import GrammarError
from edge_llm.engine.hooks import EngineObserver
from edge_llm.engine.types import (
    EmbeddingRequest,
    EngineError,
    EngineStats,
    EngineUnavailableError,
    GenerationRequest,
    ModelInfo,
)
from edge_llm.engine.thread.watchdog import Watchdog
from edge_llm.engine.thread.worker import Engine
from edge_llm.logs import current_request_id

__all__ = ["EngineClient", "GrammarError", "ReplyChannel"]

logger = logging.getLogger(__name__)

# How much lower the bulk tokenizer thread's CPU priority is (Linux niceness: 5 weighs about a third of a normal
# thread when both want a core).
BULK_NICENESS = 5

T = TypeVar("T")


class LoadedModel(Protocol):
    """What the facade reads from the engine's model besides what the engine thread uses (the real one is
    `runner.LlamaRunner`): its facts, and vocabulary work that is safe off the engine thread."""

    info: ModelInfo

    @property
    def n_vocab(self) -> int: ...
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def token_pieces(self, tokens: list[int]) -> list[bytes]: ...
    def is_valid_token(self, token: int) -> bool: ...
    def check_grammar(self, grammar: str) -> None: ...


class EngineClient:
    """The engine's public face for the API layer; it wraps one `Engine` and owns its tokenizer thread."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._tokenizer_lane = _Lane("tokenizer", engine.watchdog.limit)
        self._bulk_lane = _Lane("bulk tokenizer", engine.watchdog.limit, nice=BULK_NICENESS)
        # The tokenizer thread reads the model that the engine thread frees when it ends (a stop, a crash):
        # the engine runs this first, on its own thread, before it frees the model.
        engine.add_close_hook(self._close_tokenizer)

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the engine thread, which loads the model; idempotent."""
        self._engine.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Blocks until the engine thread has loaded the model or failed to (see `loaded`, `error`); True when it
        got that far within `timeout`."""
        return self._engine.wait_loaded(timeout)

    def on_exit(self, handler: Callable[[BaseException | None], None]) -> None:
        """`handler(error)` runs on the engine thread when it ends (error None for a normal stop)."""
        self._engine.set_exit_handler(handler)

    def set_observer(self, observer: EngineObserver) -> None:
        """Who hears about each request's progress (metrics, the access log); runs on the engine thread."""
        self._engine.observer = observer

    def close(self, timeout: float | None = 10.0) -> bool:
        """Ends everything in the one safe order: the tokenizer thread takes no more work and finishes what
        was queued, then the engine thread ends what is left with an error, frees the model and exits.
        Blocking; idempotent. True when the engine thread has ended within `timeout`."""
        self._close_tokenizer()
        return self._engine.stop(timeout)

    def _close_tokenizer(self) -> None:
        # Queued tasks still run (the model is not freed yet): a cancelled one would raise CancelledError into
        # a request that was not cancelled. Later ones are refused (`in_tokenizer_thread`).
        self._tokenizer_lane.close()
        self._bulk_lane.close()

    # ---- health --------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """The model has been loaded (it may have stopped since)."""
        return self._engine.runner is not None

    @property
    def alive(self) -> bool:
        """The engine thread runs and has not failed."""
        return self._engine.alive

    @property
    def ready(self) -> bool:
        """Loaded, alive and taking requests."""
        return self._engine.ready

    @property
    def failed(self) -> bool:
        """The engine thread died of an error (not a stop)."""
        return self._engine.failure is not None

    @property
    def error(self) -> str | None:
        """Why the engine thread died (a load failure or a crash), once it has ended; None otherwise."""
        failure = self._engine.failure
        return None if failure is None else (" ".join(str(failure).split()) or type(failure).__name__)

    def readiness(self) -> tuple[bool, str]:
        """(ready for more work, why): "ready", or "loading", "engine_dead", "stopped", "queue_full"."""
        engine = self._engine
        if engine.runner is None:
            return (False, "loading") if engine.alive else (False, "engine_dead")
        if not engine.alive:
            return False, "engine_dead"
        if not engine.ready:
            return False, "stopped"
        if engine.stats().waiting >= engine.queue_capacity:
            return False, "queue_full"
        return True, "ready"

    def stats(self) -> EngineStats:
        stats = self._engine.stats()
        watchdogs = (self._tokenizer_lane.watchdog, self._bulk_lane.watchdog)
        return dataclasses.replace(stats, watchdog_stalls=stats.watchdog_stalls + sum(w.stalls for w in watchdogs),
                                   stalled_threads=stats.stalled_threads + sum(w.stall() is not None
                                                                               for w in watchdogs))

    def stall(self) -> str | None:
        """What the watchdog (--watchdog-seconds) sees stuck now, in words: a step of the engine thread or a job
        of the tokenizer thread running past its limit; None when neither is."""
        return (self._engine.watchdog.stall() or self._tokenizer_lane.watchdog.stall()
                or self._bulk_lane.watchdog.stall())

    # ---- generation ----------------------------------------------------------------------------

    def submit(self, requests: Sequence[GenerationRequest]) -> ReplyChannel:
        """Submits one engine request per choice; their events come back on one channel, tagged with the
        choice's index. Event loop only (the channel delivers there). All or none: when one is refused
        (`EngineError`: the queue is full, the engine is not running), those already submitted are aborted
        and the error is raised."""
        channel = ReplyChannel(len(requests))
        submitted: list[GenerationRequest] = []
        try:
            for choice, request in enumerate(requests):
                self._engine.submit(request, channel.sender(choice))
                submitted.append(request)
        except EngineError:
            for request in submitted:
                self._engine.abort(request.request_id)
            raise
        return channel

    def submit_embedding(self, request: EmbeddingRequest) -> ReplyChannel:
        """Queues an embedding request; one `Embedded` (or `Failed`) comes back on the channel. Event loop only.
        Raises `EngineError` when the engine is not running."""
        channel = ReplyChannel(1)
        self._engine.submit_embedding(request, channel)
        return channel

    def abort(self, request_id: str) -> None:
        """Ends the request at the engine's next step, whatever its phase; a no-op once it has ended."""
        self._engine.abort(request_id)

    # ---- model facts and vocabulary --------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo | None:
        """The loaded model's facts; None until it is loaded."""
        runner = self._engine.runner
        return None if runner is None else cast(LoadedModel, runner).info

    @property
    def n_vocab(self) -> int:
        return self._model().n_vocab

    def is_valid_token(self, token: int) -> bool:
        return self._model().is_valid_token(token)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Blocking: call it in the tokenizer thread (`in_tokenizer_thread`)."""
        return self._model().tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        """Blocking: call it in the tokenizer thread (`in_tokenizer_thread`)."""
        return self._model().detokenize(tokens)

    def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes (a piece of a multi-byte character is not text on its own). Blocking: call it in
        the tokenizer thread."""
        return self._model().token_pieces(tokens)

    async def in_tokenizer_thread(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Runs vocabulary, chat-template and grammar work in the tokenizer thread, so that neither the event
        loop nor the engine thread waits on it. Raises `EngineUnavailableError` when the model is not ready
        or the thread is closed (the engine is stopping)."""
        self._model()
        return await self._tokenizer_lane.run(function, *args, **kwargs)

    async def in_bulk_thread(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`in_tokenizer_thread` for a large request's work (a megabyte prompt: seconds of tokenizing): its own
        thread, so the tokenizer thread stays free for the others; large requests queue behind each other only.
        It runs at a lower CPU priority (`BULK_NICENESS`), so on a machine with few cores it takes the time the
        engine's compute threads leave rather than slowing every other request's decode.
        (llama.cpp's tokenizer is safe to call from two threads at once, as llama-server's HTTP threads do.)"""
        self._model()
        return await self._bulk_lane.run(function, *args, **kwargs)

    def _model(self) -> LoadedModel:
        engine = self._engine
        runner = engine.runner
        if runner is None or not engine.ready:
            raise EngineUnavailableError("The model is not loaded yet" if engine.alive and runner is None
                                         else "The inference engine is not running")
        return cast(LoadedModel, runner)

    # ---- grammar -------------------------------------------------------------------------------

    def check_grammar(self, grammar: str) -> None:
        """Checks a GBNF grammar against the limits (engine/grammar/limits.py) and compiles it once with the model's
        vocabulary, so that the engine thread never sees one llama.cpp refuses. Raises `GrammarError`.
        Blocking: call it in the tokenizer thread."""
        self._model().check_grammar(grammar)

    @staticmethod
    def json_schema_to_grammar(schema: dict[str, Any]) -> str:
        """GBNF for a JSON schema, after the schema's own limits. Raises `GrammarError`. Blocking (a large
        schema takes a while): call it in the tokenizer thread."""
        # runner is the only module importing llama_cpp (which loads the native library): imported when first
        # needed, so that the API imports without it (unit tests run the engine with fake runners).
        from edge_llm.engine.llama.schema_grammar import json_schema_to_grammar

        return json_schema_to_grammar(schema)


class _Lane:
    """One worker thread for blocking model work, in submission order, watched by its own watchdog."""

    def __init__(self, name: str, watchdog_limit: float | None, *, nice: int = 0) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"edge-llm-{name.replace(' ', '-')}",
                                        initializer=_lower_priority, initargs=(nice,))
        self.watchdog = Watchdog(name, watchdog_limit)

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        watchdog = self.watchdog
        request_ids = [request_id] if (request_id := current_request_id()) else []
        what = getattr(function, "__name__", "job")

        def job() -> T:
            watchdog.begin(what, lambda: request_ids)
            try:
                return function(*args, **kwargs)
            finally:
                watchdog.end()

        try:
            pending = asyncio.get_running_loop().run_in_executor(self._pool, job)
        except RuntimeError:  # the pool is shut down: the engine is stopping
            raise EngineUnavailableError("The inference engine is not running") from None
        return await pending

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.watchdog.close()


def _lower_priority(nice: int) -> None:
    """Raises the calling thread's niceness by `nice` (Linux: a thread id names one thread); elsewhere a no-op."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nice)
    except OSError as exc:  # not allowed here (a sandbox): the lane works, at the usual priority
        logger.warning("could not lower the bulk tokenizer thread's priority: %s", exc)
