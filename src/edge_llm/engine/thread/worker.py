"""The engine thread: it owns the model, takes commands from one inbox and runs the step loop.

HTTP tasks call `submit` / `submit_embedding` / `abort` (thread-safe, never blocking); everything that touches
llama.cpp happens on the engine thread. Each request's text, then its end marker (`Finished`) or error (`Failed`),
flows back on its own `ReplyChannel`; an embedding request's answer is one `Embedded`. Embedding work runs one
chunk at a time between decode steps (engine/thread/embeddings.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from edge_llm.engine.hooks import EngineObserver
from edge_llm.engine.prefix_cache.disk import DiskPrefixCache
from edge_llm.engine.scheduling.scheduler import Scheduler
from edge_llm.engine.scheduling.sequence import Phase
from edge_llm.engine.scheduling.step_plan import StepPlan
from edge_llm.engine.thread.active import ActiveRequest
from edge_llm.engine.thread.channel import Outbox, Sender
from edge_llm.engine.thread.close_hooks import CloseHooks
from edge_llm.engine.thread.embeddings import EmbeddingQueue
from edge_llm.engine.thread.requests import ActiveRequests
from edge_llm.engine.thread.runner_protocol import Runner
from edge_llm.engine.thread.watchdog import Watchdog
from edge_llm.engine.types import (
    EmbeddingRequest,
    EngineStats,
    EngineUnavailableError,
    GenerationRequest,
    OutOfCellsError,
    PrefillProgress,
    QueueFullError,
    StepAbortedError,
)

logger = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        runner_factory: Callable[[], Runner],
        *,
        n_ctx: int,
        stream_cells: int | None = None,
        batch_size: int,
        parallel: int,
        cache_slots: int,
        queue_capacity: int,
        request_timeout: float | None = None,
        observer: EngineObserver | None = None,
        keep_text: bool = False,
        speculative: bool = False,
        kv_bytes_per_cell: int = 0,
        disk_cache: DiskPrefixCache | None = None,
        watchdog_seconds: float | None = None,
    ) -> None:
        self._runner_factory = runner_factory
        self.watchdog = Watchdog("engine", watchdog_seconds)  # a step past the limit is reported (engine/thread/watchdog.py)
        self.request_timeout = request_timeout
        self.observer = observer
        self._keep_text = keep_text
        self.speculative = speculative  # requests draft by prompt lookup (engine/speculative/speculation.py)
        self.kv_bytes_per_cell = kv_bytes_per_cell
        self._disk = disk_cache  # the persistent prefix cache (--prefix-cache-dir), engine/prefix_cache/disk.py
        # A stream per sequence is --deterministic's: there the last prompt token keeps a step of its own (scheduler.py)
        self._scheduler = Scheduler(n_ctx=n_ctx, batch_size=batch_size, parallel=parallel, cache_slots=cache_slots,
                                    stream_cells=stream_cells, last_token_in_chunk=stream_cells is None)
        self.queue_capacity = queue_capacity
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        # Guards _waiting_ids, and makes submit's check-and-put and the close of the inbox (_closed)
        # mutually exclusive: a request is either in the inbox before the final drain or refused.
        self._lock = threading.Lock()
        self._closed = False
        self._close_hooks = CloseHooks()
        self._waiting_ids: set[str] = set()  # submitted, not yet admitted (bounded by queue_capacity)
        self._step_requests: set[str] | None = None  # the requests of the decode in progress, while it may be stopped
        self.aborted_steps = 0
        self._requests: ActiveRequests | None = None  # engine thread only, once the model is loaded
        self._embeddings = EmbeddingQueue()  # engine thread only
        self._outbox = Outbox()  # engine thread only: flushed once a step
        self._thread = threading.Thread(target=self._main, name="edge-llm-engine", daemon=True)
        self._loaded = threading.Event()
        self.runner: Runner | None = None
        self.failure: BaseException | None = None
        self._stopped = False
        self._on_exit: Callable[[BaseException | None], None] | None = None

    # ---- lifecycle (any thread) ----------------------------------------------------------

    def start(self) -> None:
        """Starts the engine thread, which loads the model; idempotent."""
        if not self._thread.is_alive() and not self._loaded.is_set():
            self._thread.start()

    def set_exit_handler(self, handler: Callable[[BaseException | None], None]) -> None:
        """`handler(error)` runs on the engine thread when it ends; at once if it already has."""
        self._on_exit = handler
        if self._loaded.is_set() and not self._thread.is_alive():
            handler(self.failure)

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """`hook()` runs on the engine thread when it ends (engine/thread/close_hooks.py); at once if it already has."""
        self._close_hooks.add(hook)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout)

    @property
    def ready(self) -> bool:
        return self.runner is not None and self.alive and not self._stopped

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Refuses new requests, asks the engine thread to end and waits up to `timeout` for it.

        True when the thread has ended. On a timeout (a long decode step) the thread ends on its own
        after that step: only the engine thread frees the model, so nothing is freed under a decode."""
        with self._lock:
            self._stopped = True
            self._closed = True
            self._inbox.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("the engine thread is still in a decode step after %s s; it frees the model "
                           "when the step ends", timeout)
            return False
        return True

    # ---- requests (any thread) -----------------------------------------------------------

    def submit(self, request: GenerationRequest, channel: Sender) -> None:
        active = ActiveRequest(request, channel, time.monotonic())
        if self.request_timeout is not None:
            active.deadline = active.submitted_at + self.request_timeout
        with self._lock:
            if self._closed or not self.ready:
                raise EngineUnavailableError("the engine is not running")
            if len(self._waiting_ids) >= self.queue_capacity:
                raise QueueFullError(f"the request queue is full ({self.queue_capacity} waiting)")
            self._waiting_ids.add(request.request_id)
            self._inbox.put(("submit", active))

    def submit_embedding(self, request: EmbeddingRequest, channel: Sender) -> None:
        """Queues an embedding request; its `Embedded` answer (or `Failed`) comes back on `channel`."""
        with self._lock:
            if self._closed or not self.ready:
                raise EngineUnavailableError("the engine is not running")
            if len(self._waiting_ids) >= self.queue_capacity:
                raise QueueFullError(f"the request queue is full ({self.queue_capacity} waiting)")
            self._waiting_ids.add(request.request_id)  # until it is answered: embedding jobs wait in the queue
            self._inbox.put(("embed", (request, channel)))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        with self._lock:
            # The last request of a decode in progress is cancelled (an editor's stale completion, a Stop button):
            # the decode stops at its next graph node instead of computing rows nobody will read.
            live = self._step_requests
            if live and request_id in live:
                live.discard(request_id)
                if not live and self.runner is not None:
                    self.runner.abort_step()

    def stats(self) -> EngineStats:
        """A snapshot read from another thread while the engine thread may be changing it: every figure is
        an int the engine thread replaces whole (the eviction counters' keys never change)."""
        scheduler = self._scheduler
        return EngineStats(
            waiting=len(self._waiting_ids),
            running=len(scheduler.running),
            cached_sequences=len(scheduler.cache),
            kv_cells_used=scheduler.kv_cells_used,
            kv_cells_total=scheduler.n_ctx,
            preemptions=scheduler.preemptions,
            aborted_steps=self.aborted_steps,
            evictions=dict(scheduler.evictions),
            **scheduler.speculation.figures(),
            kv_bytes_per_cell=self.kv_bytes_per_cell,
            disk_cache=self._disk.stats() if self._disk is not None else None,
            watchdog_stalls=self.watchdog.stalls,
            stalled_threads=int(self.watchdog.stall() is not None),
        )

    # ---- the engine thread ------------------------------------------------------------------

    def _main(self) -> None:
        error: BaseException | None = None
        started = time.monotonic()
        try:
            self.runner = self._runner_factory()
        except BaseException as exc:  # noqa: BLE001 - reported to the owner, who exits
            error = exc
        finally:
            self._loaded.set()
        if error is None:
            logger.info("model loaded in %.1f s", time.monotonic() - started)
            if self._disk is not None and not self._disk.start():
                self._disk = None
            self._requests = ActiveRequests(runner=self.runner, scheduler=self._scheduler, outbox=self._outbox,
                                            observer=self.observer, disk=self._disk, keep_text=self._keep_text,
                                            speculative=self.speculative, forget_waiting=self._forget_waiting)
            try:
                self._loop()
            except BaseException as exc:  # noqa: BLE001
                logger.exception("engine thread died")
                error = exc
        # Not ready from here on, before anyone waiting hears why; and once _closed is set under the lock
        # submit raises, so the sweep below is the final drain of the inbox.
        self.watchdog.close()
        self.failure = error
        with self._lock:
            self._stopped = True
            self._closed = True
        if self.runner is not None:
            message, code = (
                ("the inference engine stopped unexpectedly", "engine_unavailable") if error is not None
                else ("the server is shutting down", "shutting_down")
            )
            self._fail_everything(message, code)
        self._close_hooks.run()
        if self._disk is not None:  # a graceful stop copies the pending saves and lets the writer finish them
            self._disk.close(self._scheduler, self.runner if error is None else None)
        if self.runner is not None:
            self.runner.close()  # here only: on the engine thread, after its last decode and the close hooks
        if self._on_exit is not None:
            self._on_exit(error)

    def _forget_waiting(self, request_id: str) -> None:
        with self._lock:
            self._waiting_ids.discard(request_id)

    def _loop(self) -> None:
        scheduler, requests = self._scheduler, self._requests
        assert requests is not None
        while True:
            self._outbox.flush()
            idle = scheduler.idle() and not self._embeddings.pending
            saving = idle and self._disk is not None and self._disk.has_pending_saves
            if not self._drain_inbox(requests, block=idle and not saving):
                return
            if saving and scheduler.idle():  # nothing came in: a save's copy cannot delay anyone's step
                self._disk.save_one_pending(scheduler, self.runner)
                continue
            self.watchdog.begin("step", self._running_ids)
            if self.request_timeout is not None and requests:
                requests.expire(time.monotonic())
            self._outbox.flush()  # cancellations and refusals at once, not a step later (a no-op when none)
            if self._disk is not None:
                self._disk.before_step(scheduler, self.runner)  # saved prefixes the next admissions want
            plan = scheduler.step()
            now = time.monotonic()
            observer = self.observer
            for sequence in plan.admitted:
                active = requests.get(sequence.request_id)
                assert active is not None
                if sequence.preemptions:
                    continue  # resumed: its admission was counted the first time
                active.admitted_at = now
                with self._lock:
                    self._waiting_ids.discard(sequence.request_id)
                if observer is not None:
                    observer.request_admitted(sequence.request_id, now - active.submitted_at, len(sequence.prompt),
                                              sequence.cached_tokens, sequence.moved_tokens)
            for sequence in plan.preempted:
                preempted = requests.get(sequence.request_id)
                assert preempted is not None
                preempted.preempted_at = now
                logger.info("preempted after %d tokens to free KV cells (%d free of %d); it resumes first",
                            sequence.generated, scheduler.free_cells, scheduler.n_ctx,
                            extra={"request_id": sequence.request_id})
            self.runner.apply_kv_ops(plan.kv_ops)
            if not plan.empty and self._decode(plan):
                drafts = {id(sequence): rows for sequence, rows in plan.drafts}
                for sequence, batch_index in plan.samples:
                    active = requests.get(sequence.request_id)
                    if active is not None:
                        requests.sample(active, [batch_index, *drafts.get(id(sequence), ())])
                if plan.prefilled_tokens:
                    self._report_prefill(plan, requests)
            if self._embeddings.pending:  # one small chunk between decode steps, after this step's tokens are sent
                self._outbox.flush()
                answered = self._embeddings.step(self.runner.hidden_states, self._outbox)
                if answered is not None:
                    with self._lock:
                        self._waiting_ids.discard(answered)
            self.watchdog.end()

    def _running_ids(self) -> list[str]:
        """The requests of the step in progress (called by the watchdog thread when a step is late)."""
        return [sequence.request_id for sequence in list(self._scheduler.running)]

    def _report_prefill(self, plan: StepPlan, requests: ActiveRequests) -> None:
        """Each prompt longer than a step whose prefill this step moved but did not end: its progress, for streams
        that show it."""
        in_step = set(plan.seq_ids)
        for sequence in self._scheduler.running:
            active = requests.get(sequence.request_id)
            if (active is not None and sequence.phase is Phase.PREFILL and sequence.seq_id in in_step
                    and len(sequence.feed) > self._scheduler.batch_size):
                self._outbox.add(active.channel,
                                 PrefillProgress(sequence.n_past, len(sequence.feed), sequence.cached_tokens))

    def _drain_inbox(self, requests: ActiveRequests, *, block: bool) -> bool:
        """Handles every queued command; waits for one if there is nothing to do. False means stop."""
        while True:
            try:
                command, payload = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command == "submit":
                requests.admit(payload)
            elif command == "abort":
                self._forget_waiting(payload)
                if not self._embeddings.cancel(payload):
                    requests.cancel(payload)
            elif command == "embed":
                self._embeddings.add(*payload)
            elif command == "stop":
                return False

    def _decode(self, plan: StepPlan) -> bool:
        """Decodes the step's batch; False when it was stopped because every request in it was cancelled (the step
        is taken back: the cancellations, in the inbox, end the requests next)."""
        # The flag is cleared before every decode (an abort that came after the last one ended must not stop this
        # one); only an undoable step publishes its requests, so only it can be stopped.
        requests = None
        if plan.undoable:
            in_step = set(plan.seq_ids)
            requests = {s.request_id for s in self._scheduler.running if s.seq_id in in_step}
        with self._lock:
            self.runner.arm_abort()
            self._step_requests = requests
        try:
            self.runner.decode(plan)
        except OutOfCellsError:
            # Cells can be fragmented beyond what the budget shows: drop the prefix cache and retry once.
            logger.warning("KV cache full during decode; clearing the prefix cache and retrying")
            self._scheduler.clear_cache()
            self.runner.apply_kv_ops(self._scheduler.take_pending_ops())
            self.runner.decode(plan)
        except StepAbortedError:
            self._scheduler.undo_step(plan)
            self.aborted_steps += 1
            logger.debug("decode stopped: every request in it was cancelled")
            return False
        finally:
            with self._lock:
                self._step_requests = None
        return True

    def _fail_everything(self, message: str, code: str) -> None:
        never_admitted: list[ActiveRequest] = []
        while True:  # requests submitted but never seen by the loop
            try:
                command, payload = self._inbox.get_nowait()
            except queue.Empty:
                break
            if command == "submit":
                never_admitted.append(payload)
            elif command == "embed":
                self._embeddings.add(*payload)
        self._embeddings.fail_all(self._outbox, message, code)
        assert self._requests is not None
        self._requests.fail_all(never_admitted, message, code)
        self._outbox.flush()
        with self._lock:
            self._waiting_ids.clear()
