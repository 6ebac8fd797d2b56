"""The model registry: model name → its engine (one engine thread per loaded model), loaded on a request's demand,
unloaded when idle (keep_alive), within a memory budget and a count limit.

Everything here runs on the event loop except `close` (any thread). A request takes a `Lease` on its model for as
long as it is served (`acquire` … `Lease.release`): a leased model is never unloaded. The first request for an
unloaded model starts its load; later ones wait on the same load. A load that does not fit first unloads the least
recently used idle models (budget.py); when only busy or pinned models hold the memory, the request waits for a
change (a request ending, a model unloading) up to `wait_timeout`, then gets `ModelUnavailableError` naming them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from edge_llm.engine.facade import EngineClient
from edge_llm.engine.types import EngineStats
from edge_llm.models.gguf_report import human_bytes
from edge_llm.registry.entry import (
    DEFAULT_KEEP_ALIVE,
    ModelEntry,
    ModelState,
    ModelUnavailableError,
    UnknownModelError,
    KeepAliveDefault,
)
from edge_llm.registry.loading import EngineFactory, Loader
from edge_llm.registry.names import NameIndex, NameTaken, same_name
from edge_llm.registry.specs import ModelSpec

__all__ = ["DEFAULT_KEEP_ALIVE", "EngineFactory", "Lease", "ModelEntry", "ModelRegistry", "ModelState",
           "ModelUnavailableError", "UnknownModelError"]

logger = logging.getLogger(__name__)

KeepAlive = float | None | KeepAliveDefault  # seconds, None (never unload), or the server's default
BUSY_RETRY_AFTER = 5  # seconds, the Retry-After of a request refused for memory held by busy models


@dataclass(eq=False)
class Lease:
    """A request's hold on a loaded model; `release` it when the response is over (idempotent)."""

    registry: ModelRegistry
    entry: ModelEntry
    client: EngineClient
    load_ms: float  # how long the request waited for the model to load (0 when it was loaded)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.registry._release(self.entry)


class ModelRegistry:
    def __init__(
        self,
        specs: Iterable[ModelSpec],
        factory: EngineFactory,
        *,
        default_model: str,
        keep_alive: float | None,
        budget: int | None = None,
        max_loaded: int | None = None,
        wait_timeout: float = 30.0,
        on_demand: bool = True,
    ) -> None:
        """`on_demand` False: one model, loaded at start (`start`), whose load failure or death ends the server
        (`on_fatal`); True: models load on their first request and a load failure is that request's 503."""
        self._entries: dict[str, ModelEntry] = {}
        self._names: NameIndex[ModelEntry] = NameIndex()
        for spec in specs:
            self.add(spec, keep_alive)
        self.default_model = default_model
        self.default_keep_alive = keep_alive
        self.budget = budget
        self.max_loaded = max_loaded
        self.wait_timeout = wait_timeout
        self.on_demand = on_demand
        self.on_fatal: Callable[[BaseException], None] = lambda error: None
        # Called with each new engine before it starts (the API sets its observer: metrics, access log).
        self.prepare: Callable[[ModelSpec, EngineClient], None] = lambda spec, client: None
        # Called with a model's name and load time in seconds each time a load completes (the API's histogram).
        self.on_loaded: Callable[[str, float], None] = lambda name, seconds: None
        self._changed: asyncio.Event | None = None
        self._loader = Loader(factory, budget=budget, max_loaded=max_loaded, on_demand=on_demand,
                              entries=self._entries.values, notify=self._notify, events=self)

    # ---- names ------------------------------------------------------------------------------------

    @property
    def entries(self) -> list[ModelEntry]:
        return list(self._entries.values())

    def available(self) -> list[str]:
        """Every name a request may use, model ids first."""
        ids = list(self._entries)
        others = (n for e in self._entries.values() for n in (e.spec.ollama_name, *e.spec.aliases, *e.copies))
        return ids + list(dict.fromkeys(n for n in others if n and n not in ids))

    def resolve(self, name: str | None) -> ModelEntry:
        """The model `name` means (registry/names.py: exact names, then Ollama's spellings); None: the default one.
        Raises UnknownModelError: a name that means no model is never served by another."""
        entry = self._names.owner(name or self.default_model)
        if entry is None:
            raise UnknownModelError(name or "", self.available())
        return entry

    def add(self, spec: ModelSpec, keep_alive: KeepAlive = DEFAULT_KEEP_ALIVE) -> ModelEntry:
        """A model to serve from now on (a file fetched by Ollama's /api/pull). Raises NameTaken when one of its
        names is another model's."""
        if spec.name in self._entries:
            raise NameTaken(spec.name, self._entries[spec.name])
        entry = ModelEntry(spec, self.default_keep_alive if isinstance(keep_alive, KeepAliveDefault) else keep_alive)
        for name in spec.names:
            self._names.add(name, entry)  # (checked name by name: a clash leaves the earlier names behind)
        self._entries[spec.name] = entry
        return entry

    def remove(self, entry: ModelEntry) -> None:
        """Stops serving an unloaded, unused model (Ollama's /api/delete). Raises ValueError otherwise."""
        if entry.holds_memory or entry.leases or entry.waiters:
            raise ValueError(f"the model '{entry.name}' is {entry.state.value} or in use")
        self._names.discard_owner(entry)
        self._entries.pop(entry.name, None)
        self._notify()

    def add_copy(self, name: str, entry: ModelEntry) -> None:
        """Another name for a model, for the server's lifetime (Ollama's /api/copy). Raises NameTaken when it is
        another model's name."""
        self._names.add(name, entry)
        if name not in entry.names:
            entry.copies.append(name)

    def remove_copy(self, name: str) -> ModelEntry | None:
        """Forgets a name given by `add_copy`; the model it named, or None when `name` is no copy."""
        entry = self._names.owner(name)
        copy = next((copy for copy in entry.copies if same_name(name, (copy,))), None) if entry else None
        if entry is None or copy is None:
            return None
        entry.copies.remove(copy)
        self._names.discard(copy)
        for own in entry.names:  # a name of its own spelled the same way as the copy stays its name
            self._names.add(own, entry)
        return entry

    # ---- start and stop -----------------------------------------------------------------------------

    def start(self) -> None:
        """On the event loop, before any request: with `on_demand` False the one model starts loading now."""
        self._loader.loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        if not self.on_demand:
            entry = self.resolve(None)
            room = self._loader.load_if_room(entry)
            assert room, "one model always fits"

    def preload(self) -> None:
        """With `on_demand` False, starts loading the one model now (any thread, before the event loop runs) so that
        the load overlaps the rest of the start-up; `start` adopts the engine."""
        if self.on_demand or self._loader.preloaded:
            return
        self._loader.preload(self.resolve(None))

    def close(self) -> None:
        """Stops every engine (blocking; any thread): what runs ends with an error event, the models are freed."""
        self._loader.closing = True
        for entry in self._entries.values():
            client = entry.client  # loaded, or still loading
            if client is not None:
                client.close()

    # ---- a request's model ------------------------------------------------------------------------

    async def acquire(self, name: str | None, keep_alive: KeepAlive = DEFAULT_KEEP_ALIVE) -> Lease:
        """A lease on the model `name` names (None: the default model), loading it first when it is not loaded.
        Raises UnknownModelError, ModelUnavailableError."""
        entry = self.resolve(name)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.wait_timeout
        waited_for_load = False
        entry.waiters += 1
        try:
            while True:
                if self._loader.closing:
                    raise ModelUnavailableError("The server is shutting down", code="shutting_down", retry_after=5)
                if entry.state is ModelState.LOADED:
                    break
                if entry.state in (ModelState.LOADING, ModelState.UNLOADING):
                    waited_for_load = waited_for_load or entry.state is ModelState.LOADING
                    assert entry.task is not None
                    await asyncio.shield(entry.task)
                    continue
                self._loader.check_fits_at_all(entry)
                room = self._loader.load_if_room(entry)
                if room:
                    waited_for_load = True
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._busy_error(entry)
                await self.wait_for_change(remaining)
        finally:
            entry.waiters -= 1
        assert entry.client is not None
        entry.leases += 1
        self._loader.cancel_timer(entry)
        entry.keep_alive = self.default_keep_alive if isinstance(keep_alive, KeepAliveDefault) else keep_alive
        load_ms = round((loop.time() - started) * 1000, 2) if waited_for_load else 0.0
        return Lease(self, entry, entry.client, load_ms)

    def _release(self, entry: ModelEntry) -> None:
        entry.leases -= 1
        entry.last_used = time.monotonic()
        if entry.leases == 0:
            self._loader.schedule_idle(entry)
        self._notify()

    async def load(self, name: str | None, keep_alive: KeepAlive = DEFAULT_KEEP_ALIVE) -> ModelEntry:
        """POST /models/load: loaded (or already so); it then stays as `keep_alive` says."""
        lease = await self.acquire(name, keep_alive)
        lease.release()
        return lease.entry

    async def unload(self, name: str | None) -> ModelEntry:
        """POST /models/unload: unloaded now when idle (pinned or not), else as soon as its requests end."""
        entry = self.resolve(name)
        while entry.state is ModelState.LOADING and entry.task is not None:
            try:
                await asyncio.shield(entry.task)
            except ModelUnavailableError:
                pass
        if entry.state is ModelState.LOADED:
            if entry.leases or entry.waiters:
                entry.unload_when_idle = True
                logger.info("model %s will unload when its %d requests end", entry.name, entry.leases)
                return entry
            self._loader.start_unload(entry, "request")
        if entry.state is ModelState.UNLOADING and entry.task is not None:
            await asyncio.shield(entry.task)
        return entry

    # ---- waiting for room ---------------------------------------------------------------------------

    def _notify(self) -> None:
        """Wakes every request waiting for room: something was released, loaded or unloaded."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def wait_for_change(self, timeout: float) -> None:
        """Returns when a model was loaded, unloaded or released, or after `timeout` seconds."""
        assert self._changed is not None
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def _busy_error(self, entry: ModelEntry) -> ModelUnavailableError:
        holders = [e for e in self._entries.values() if e is not entry and e.holds_memory]
        held = sum(e.spec.memory_bytes for e in holders)

        def why(e: ModelEntry) -> str:
            if e.leases:
                return f"{e.leases} request{'s' if e.leases > 1 else ''} in flight"
            if e.state is not ModelState.LOADED:
                return e.state.value
            return "pinned" if e.pinned else "waited on"

        listing = ", ".join(f"{e.name} (~{human_bytes(e.spec.memory_bytes)}, {why(e)})" for e in holders)
        limits = []
        if self.budget is not None:
            limits.append(f"the memory budget is {human_bytes(self.budget)}, {human_bytes(held)} held")
        if self.max_loaded is not None:
            limits.append(f"at most {self.max_loaded} model{'s' if self.max_loaded > 1 else ''} loaded")
        return ModelUnavailableError(
            f"No room to load the model '{entry.name}' (~{human_bytes(entry.spec.memory_bytes)}): "
            f"{'; '.join(limits)}, and the models holding it cannot be unloaded now: {listing}. "
            f"Retry later, or unload one (POST /models/unload)", code="model_memory_busy",
            retry_after=BUSY_RETRY_AFTER)

    # ---- health and statistics ----------------------------------------------------------------------

    def loaded_clients(self) -> list[tuple[str, EngineClient]]:
        return [(e.name, e.client) for e in self._entries.values()
                if e.state is ModelState.LOADED and e.client is not None]

    def health(self) -> tuple[bool, str]:
        """(alive, status): alive while no serving engine has died."""
        for _, client in self.loaded_clients():
            if not client.alive:
                return False, "engine_dead" if client.failed else "stopped"
        if not self.on_demand:
            entry = self.resolve(None)
            if entry.error is not None:
                return False, "engine_dead"
        return True, "ok"

    def stall(self) -> str | None:
        """What a loaded model's watchdog sees stuck now (engine/thread/watchdog.py), in words, or None."""
        for name, client in self.loaded_clients():
            stall = client.stall()
            if stall is not None:
                return f"{name}: {stall}" if self.on_demand else stall
        return None

    def readiness(self) -> tuple[bool, str]:
        """With one model served from start-up: its engine's readiness ("loading" until it is loaded). Serving on
        demand: ready while the server accepts work, whatever is loaded (a request loads its model)."""
        if self._loader.closing:
            return False, "stopped"
        if self.on_demand:
            alive, status = self.health()
            return (True, "ready") if alive else (False, status)
        entry = self.resolve(None)
        if entry.state is ModelState.LOADED and entry.client is not None:
            return entry.client.readiness()
        if entry.error is not None:
            return False, "engine_dead"
        return (False, "loading") if entry.loads == 0 else (True, "ready")

    def stats(self) -> EngineStats:
        """Every loaded engine's statistics, summed (the unlabelled metrics)."""
        return EngineStats.total([client.stats() for _, client in self.loaded_clients()])
