"""Loading and unloading a registry's models, on the event loop: room made first by unloading the least recently
used idle models (budget.py), the engine started and waited for off the loop, an engine's death reported, and idle
models unloaded when their keep_alive runs out. `registry.ModelRegistry` decides when; this module does it."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from edge_llm.engine.facade import EngineClient
from edge_llm.models.gguf_report import human_bytes
from edge_llm.registry.budget import Resident, make_room
from edge_llm.registry.entry import ModelEntry, ModelState, ModelUnavailableError
from edge_llm.registry.specs import ModelSpec

logger = logging.getLogger(__name__)

EngineFactory = Callable[[ModelSpec], EngineClient]


class LoadEvents(Protocol):
    """What the API hooks into loads (the registry's attributes of these names)."""

    prepare: Callable[[ModelSpec, EngineClient], None]  # each new engine, before it starts
    on_loaded: Callable[[str, float], None]  # a model's name and load time in seconds, each time a load completes
    on_fatal: Callable[[BaseException], None]  # an engine death that ends the server


class Loader:
    def __init__(self, factory: EngineFactory, *, budget: int | None, max_loaded: int | None, on_demand: bool,
                 entries: Callable[[], Iterable[ModelEntry]], notify: Callable[[], None], events: LoadEvents) -> None:
        self._factory = factory
        self.budget = budget
        self.max_loaded = max_loaded
        self.on_demand = on_demand
        self._entries = entries
        self._notify = notify  # wakes the requests waiting for room
        self._events = events
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the registry's start
        self.closing = False
        self.preloaded: dict[str, tuple[EngineClient, float]] = {}  # name → engine, when its load started

    def preload(self, entry: ModelEntry) -> None:
        """Starts loading `entry` now (any thread, before the event loop runs); its `load` adopts the engine."""
        started = time.monotonic()
        client = self._factory(entry.spec)
        client.start()
        self.preloaded[entry.name] = (client, started)
        entry.client = client


    def check_fits_at_all(self, entry: ModelEntry) -> None:
        if self.budget is not None and entry.spec.memory_bytes > self.budget:
            raise ModelUnavailableError(
                f"The model '{entry.name}' needs ~{human_bytes(entry.spec.memory_bytes)}, more than the whole memory "
                f"budget ({human_bytes(self.budget)}; --memory-budget, --ctx-size)", code="model_too_large")

    def load_if_room(self, entry: ModelEntry) -> bool:
        """Starts the load, after unloading what must make room; False when busy or pinned models hold it."""
        residents = [
            Resident(e.name, e.spec.memory_bytes, self._evictable(e), e.last_used)
            for e in self._entries() if e is not entry and e.holds_memory
        ]
        room = make_room(entry.spec.memory_bytes, residents, budget=self.budget, max_loaded=self.max_loaded)
        if not room.fits:
            return False
        unloads = [self.start_unload(next(e for e in self._entries() if e.name == victim), "evicted") for victim in room.victims]
        entry.state = ModelState.LOADING
        entry.error = None
        assert self.loop is not None
        entry.task = self.loop.create_task(self._load(entry, unloads), name=f"load {entry.name}")
        entry.task.add_done_callback(_retrieve_exception)
        self._notify()
        return True

    @staticmethod
    def _evictable(entry: ModelEntry) -> bool:
        return entry.state is ModelState.LOADED and not entry.leases and not entry.waiters and not entry.pinned

    async def _load(self, entry: ModelEntry, unloads: list[asyncio.Task[None]]) -> None:
        for unload in unloads:  # their memory is returned before this model takes its own
            await asyncio.shield(unload)
        logger.info("loading model %s (~%s)", entry.name, human_bytes(entry.spec.memory_bytes))
        client: EngineClient | None = None
        try:
            preloaded = self.preloaded.pop(entry.name, None)
            if preloaded is None:
                started = time.monotonic()
                client = self._factory(entry.spec)
            else:
                client, started = preloaded
            entry.client = client
            self._events.prepare(entry.spec, client)
            client.on_exit(self._exit_handler(entry, client))
            client.start()
            await asyncio.to_thread(client.wait_loaded)
            if not client.loaded:
                await asyncio.to_thread(client.close)
                raise ModelUnavailableError(f"The model '{entry.name}' could not be loaded: {client.error}",
                                            code="model_load_failed")
            if self.closing:  # close() may have run before this engine existed
                await asyncio.to_thread(client.close)
                raise ModelUnavailableError("The server is shutting down", code="shutting_down", retry_after=5)
        except BaseException as exc:
            entry.client = None
            entry.state = ModelState.UNLOADED
            entry.error = str(exc)
            # With one model served from start-up the server stops and says why in its one error line (api/app.py).
            logger.log(logging.ERROR if self.on_demand else logging.WARNING, "model %s: %s", entry.name, exc)
            self._notify()
            if isinstance(exc, ModelUnavailableError):
                raise
            raise ModelUnavailableError(f"The model '{entry.name}' could not be loaded: {exc}",
                                        code="model_load_failed") from exc
        entry.state = ModelState.LOADED
        entry.loads += 1
        entry.load_seconds = time.monotonic() - started
        entry.loaded_at = time.time()
        entry.last_used = time.monotonic()
        entry.unload_when_idle = False
        logger.info("model %s loaded in %.1f s", entry.name, entry.load_seconds)
        self._events.on_loaded(entry.name, entry.load_seconds)
        if not entry.waiters:  # loaded without a request (start-up, or one that gave up): its keep-alive runs now
            self.schedule_idle(entry)
        self._notify()

    def start_unload(self, entry: ModelEntry, reason: str) -> asyncio.Task[None]:
        self.cancel_timer(entry)
        client = entry.client
        assert client is not None and self.loop is not None
        entry.state = ModelState.UNLOADING
        entry.task = self.loop.create_task(self._unload(entry, client, reason), name=f"unload {entry.name}")
        self._notify()
        return entry.task

    async def _unload(self, entry: ModelEntry, client: EngineClient, reason: str) -> None:
        logger.info("unloading model %s (%s)", entry.name, reason)
        try:
            await asyncio.to_thread(client.close)  # the engine thread frees the model and its context
            await asyncio.to_thread(_return_freed_memory)
        except Exception:  # noqa: BLE001 - the entry must still end up unloaded
            logger.exception("model %s: error while unloading", entry.name)
        finally:
            entry.client = None
            entry.attachments.clear()
            entry.state = ModelState.UNLOADED
            entry.loaded_at = None
            entry.unloads[reason] += 1
            logger.info("model %s unloaded (%s)", entry.name, reason)
            self._notify()

    def _exit_handler(self, entry: ModelEntry, client: EngineClient) -> Callable[[BaseException | None], None]:
        """Runs on the engine thread when it ends; a death (not a stop) is looked at on the event loop."""
        loop = self.loop
        assert loop is not None

        def ended(error: BaseException | None) -> None:
            if error is not None:
                try:
                    loop.call_soon_threadsafe(self._engine_died, entry, client, error)
                except RuntimeError:
                    pass  # the event loop is closed

        return ended

    def _engine_died(self, entry: ModelEntry, client: EngineClient, error: BaseException) -> None:
        """A serving engine's death, or a failed load of the one model served without `on_demand`, ends the server
        (as with one engine: its state is unknown); a failed load on demand is only its requests' 503 (`_load`)."""
        serving = entry.client is client and entry.state is ModelState.LOADED
        if serving or not self.on_demand:
            self._events.on_fatal(error)

    # ---- idleness -----------------------------------------------------------------------------------

    def schedule_idle(self, entry: ModelEntry) -> None:
        self.cancel_timer(entry)
        if entry.state is not ModelState.LOADED or entry.leases or entry.waiters or self.closing:
            return
        if entry.unload_when_idle:
            self.start_unload(entry, "request")
        elif entry.pinned:
            return
        elif entry.keep_alive == 0:
            self.start_unload(entry, "keep_alive")
        else:
            assert self.loop is not None and entry.keep_alive is not None
            entry.timer = self.loop.call_later(entry.keep_alive, self._expire, entry)

    def _expire(self, entry: ModelEntry) -> None:
        entry.timer = None
        if self._evictable(entry) and not self.closing:
            self.start_unload(entry, "idle")

    @staticmethod
    def cancel_timer(entry: ModelEntry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None


def _return_freed_memory() -> None:
    """Hands the heap's free pages back to the system (glibc keeps what small allocations freed, such as a model's
    vocabulary), so an unloaded model's memory shows as returned; a no-op elsewhere."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _retrieve_exception(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # a failed load is reported to its waiters; nobody else needs to hear of it
