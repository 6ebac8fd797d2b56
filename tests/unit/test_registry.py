"""The model registry's rules, with fake engines: one shared load, keep_alive, the memory budget, eviction of the
least recently used idle model, pinning, waiting for room and the 503 that names who holds it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from edge_llm.config import Settings
from edge_llm.engine.types import EngineStats
from edge_llm.registry.budget import Resident, Room, make_room
from edge_llm.registry.keep_alive import describe_keep_alive, parse_keep_alive
from edge_llm.registry.registry import (
    ModelRegistry,
    ModelState,
    ModelUnavailableError,
    UnknownModelError,
)
from edge_llm.registry.specs import ModelSpec

MB = 1_000_000


class FakeClient:
    """What the registry uses of an EngineClient; `gate` holds its load until set."""

    def __init__(self, name: str, gate: threading.Event, fail: bool = False) -> None:
        self.name = name
        self.gate = gate
        self.fail = fail
        self.loaded = False
        self.closed = False
        self.exit_handler: Callable[[BaseException | None], None] | None = None

    def set_observer(self, observer: Any) -> None: ...

    def on_exit(self, handler: Callable[[BaseException | None], None]) -> None:
        self.exit_handler = handler

    def start(self) -> None: ...

    def wait_loaded(self, timeout: float | None = None) -> bool:
        self.gate.wait(10)
        self.loaded = not self.fail
        return True

    @property
    def error(self) -> str | None:
        return "bad magic" if self.fail else None

    def close(self, timeout: float | None = 10.0) -> bool:
        self.closed = True
        return True

    alive = True
    failed = False

    def readiness(self) -> tuple[bool, str]:
        return True, "ready"

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 0, 100)


class Factory:
    def __init__(self) -> None:
        self.made: list[FakeClient] = []
        self.gates: dict[str, threading.Event] = {}
        self.failing: set[str] = set()

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def __call__(self, spec: ModelSpec) -> Any:
        client = FakeClient(spec.name, self.gate(spec.name), spec.name in self.failing)
        self.made.append(client)
        return client


def spec(name: str, memory: int = 400 * MB, *, pinned: bool = False) -> ModelSpec:
    return ModelSpec(name, Path(f"/models/{name}.gguf"), (f"{name}-alias",), memory, pinned)


def registry(factory: Factory, *specs: ModelSpec, **options: Any) -> ModelRegistry:
    options.setdefault("keep_alive", 300.0)
    options.setdefault("default_model", specs[0].name)
    return ModelRegistry(specs, factory, **options)


def run(test: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 20))


async def until(reg: ModelRegistry, condition: Callable[[], bool]) -> None:
    while not condition():
        await reg.wait_for_change(1.0)


def test_requests_for_an_unloaded_model_share_one_load_and_say_they_waited() -> None:
    factory = Factory()
    reg = registry(factory, spec("a"))

    async def test() -> None:
        reg.start()
        first = asyncio.ensure_future(reg.acquire("a"))
        second = asyncio.ensure_future(reg.acquire("a-alias"))
        await until(reg, lambda: reg.resolve("a").state is ModelState.LOADING)
        factory.gate("a").set()
        leases = await asyncio.gather(first, second)
        assert len(factory.made) == 1
        assert all(lease.load_ms > 0 for lease in leases)
        assert reg.resolve("a").leases == 2
        third = await reg.acquire(None)  # the default model, loaded: no wait
        assert third.load_ms == 0.0
        for lease in (*leases, third):
            lease.release()

    run(test)


def test_an_unknown_model_lists_the_available_names() -> None:
    reg = registry(Factory(), spec("a"), spec("b"))
    with pytest.raises(UnknownModelError) as caught:
        reg.resolve("gpt-4")
    assert caught.value.available == ["a", "b", "a-alias", "b-alias"]


def test_keep_alive_zero_unloads_after_the_request_and_minus_one_keeps_it() -> None:
    factory = Factory()
    factory.gate("a").set()
    reg = registry(factory, spec("a"))

    async def test() -> None:
        reg.start()
        lease = await reg.acquire("a", None)  # keep_alive -1
        lease.release()
        assert reg.resolve("a").state is ModelState.LOADED
        lease = await reg.acquire("a", 0.0)
        assert reg.resolve("a").state is ModelState.LOADED  # not while it is in use
        lease.release()
        await until(reg, lambda: reg.resolve("a").state is ModelState.UNLOADED)
        assert factory.made[0].closed and reg.resolve("a").unloads["keep_alive"] == 1

    run(test)


def test_an_idle_model_unloads_when_its_keep_alive_runs_out() -> None:
    factory = Factory()
    factory.gate("a").set()
    reg = registry(factory, spec("a"), keep_alive=0.05)

    async def test() -> None:
        reg.start()
        (await reg.acquire("a")).release()
        await until(reg, lambda: reg.resolve("a").state is ModelState.UNLOADED)
        assert reg.resolve("a").unloads["idle"] == 1

    run(test)


def test_a_busy_model_is_never_evicted_the_request_waits_then_gets_a_503_naming_it() -> None:
    factory = Factory()
    for name in "ab":
        factory.gate(name).set()
    reg = registry(factory, spec("a", 600 * MB), spec("b", 600 * MB), budget=1000 * MB, wait_timeout=0.05)

    async def test() -> None:
        reg.start()
        busy = await reg.acquire("a")
        with pytest.raises(ModelUnavailableError) as caught:
            await reg.acquire("b")
        assert caught.value.code == "model_memory_busy" and caught.value.retry_after
        assert "a (~" in str(caught.value) and "1 request in flight" in str(caught.value)
        assert reg.resolve("a").state is ModelState.LOADED
        busy.release()  # now idle: the next request for b evicts it
        lease = await reg.acquire("b")
        assert reg.resolve("a").state is ModelState.UNLOADED and reg.resolve("a").unloads["evicted"] == 1
        lease.release()

    run(test)


def test_a_request_waiting_for_room_gets_it_when_the_busy_model_is_released() -> None:
    factory = Factory()
    for name in "ab":
        factory.gate(name).set()
    reg = registry(factory, spec("a", 600 * MB), spec("b", 600 * MB), budget=1000 * MB, wait_timeout=10)

    async def test() -> None:
        reg.start()
        busy = await reg.acquire("a")
        waiting = asyncio.ensure_future(reg.acquire("b"))
        await until(reg, lambda: reg.resolve("b").waiters == 1)
        assert not waiting.done()
        busy.release()
        lease = await waiting
        assert lease.entry.name == "b" and reg.resolve("a").state is ModelState.UNLOADED
        lease.release()

    run(test)


def test_pinned_models_are_not_evicted_and_lru_picks_the_oldest_idle_one() -> None:
    factory = Factory()
    for name in "pabc":
        factory.gate(name).set()
    reg = registry(factory, spec("p", pinned=True), spec("a"), spec("b"), spec("c"), max_loaded=3, wait_timeout=0.05)

    async def test() -> None:
        reg.start()
        for name in ("p", "a", "b"):
            (await reg.acquire(name)).release()
        (await reg.acquire("c")).release()  # a, the least recently used idle one, makes room
        states = {e.name: e.state for e in reg.entries}
        assert states == {"p": ModelState.LOADED, "a": ModelState.UNLOADED, "b": ModelState.LOADED,
                          "c": ModelState.LOADED}

    run(test)


def test_only_pinned_models_hold_the_memory_503_says_so() -> None:
    factory = Factory()
    for name in "pa":
        factory.gate(name).set()
    reg = registry(factory, spec("p", pinned=True), spec("a"), max_loaded=1, wait_timeout=0.05)

    async def test() -> None:
        reg.start()
        (await reg.acquire("p")).release()
        with pytest.raises(ModelUnavailableError, match=r"p \(~.*pinned"):
            await reg.acquire("a")

    run(test)


def test_a_model_bigger_than_the_budget_is_refused_at_once() -> None:
    reg = registry(Factory(), spec("a", 2000 * MB), budget=1000 * MB)

    async def test() -> None:
        reg.start()
        with pytest.raises(ModelUnavailableError) as caught:
            await reg.acquire("a")
        assert caught.value.code == "model_too_large" and caught.value.retry_after is None

    run(test)


def test_a_failed_load_is_the_requests_error_and_the_next_request_tries_again() -> None:
    factory = Factory()
    factory.gate("a").set()
    factory.failing.add("a")
    reg = registry(factory, spec("a"))

    async def test() -> None:
        reg.start()
        with pytest.raises(ModelUnavailableError, match="bad magic") as caught:
            await reg.acquire("a")
        assert caught.value.code == "model_load_failed"
        assert reg.resolve("a").state is ModelState.UNLOADED
        factory.failing.clear()
        (await reg.acquire("a")).release()
        assert len(factory.made) == 2

    run(test)


def test_unload_of_a_busy_model_waits_for_its_requests() -> None:
    factory = Factory()
    factory.gate("a").set()
    reg = registry(factory, spec("a"), keep_alive=None)

    async def test() -> None:
        reg.start()
        lease = await reg.acquire("a")
        entry = await reg.unload("a")
        assert entry.state is ModelState.LOADED and entry.unload_when_idle
        lease.release()
        await until(reg, lambda: entry.state is ModelState.UNLOADED)
        assert entry.unloads["request"] == 1

    run(test)


def test_make_room_evicts_least_recently_used_idle_models_only_as_needed() -> None:
    residents = [Resident("old", 300, True, 1.0), Resident("busy", 300, False, 0.5), Resident("new", 300, True, 2.0)]
    assert make_room(300, residents, budget=1000, max_loaded=None).victims == ("old",)
    assert make_room(100, residents, budget=1000, max_loaded=None).victims == ()
    assert make_room(500, residents, budget=1000, max_loaded=None).victims == ("old", "new")
    blocked = make_room(800, residents, budget=1000, max_loaded=None)
    assert not blocked.fits and blocked.holders == ("old", "busy", "new")
    assert make_room(1, residents, budget=None, max_loaded=3).victims == ("old",)


def test_make_room_that_cannot_fit_says_so_and_names_every_holder() -> None:
    residents = [Resident("a", 600, True, 1.0), Resident("busy", 300, False, 0.5)]
    assert make_room(800, residents, budget=1000, max_loaded=None) == Room(False, holders=("a", "busy"))


def test_make_room_under_a_count_limit_unloads_until_one_more_is_allowed() -> None:
    residents = [Resident(name, 10, True, float(i)) for i, name in enumerate(("first", "second", "third"))]
    assert make_room(10, residents, budget=None, max_loaded=2) == Room(True, victims=("first", "second"))
    assert make_room(10, residents, budget=None, max_loaded=4) == Room(True)


@pytest.mark.parametrize(("value", "seconds"), [
    ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("500ms", 0.5), (10, 10.0), ("10", 10.0), (0, 0.0),
    ("0", 0.0), (-1, None), ("-1", None), ("-1m", None), (2.5, 2.5),
])
def test_keep_alive_values(value: Any, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "m", "", True, [], "1x", "nan"])
def test_bad_keep_alive_values(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_keep_alive(value)


@pytest.mark.parametrize(("value", "message"), [
    (True, 'keep_alive must be a duration ("5m"), a number of seconds, 0 or -1'),
    ([], 'keep_alive must be a duration ("5m"), a number of seconds, 0 or -1'),
    (float("inf"), "keep_alive must be finite"), (float("-inf"), "keep_alive must be finite"),
    ("X5m", "keep_alive 'X5m' is not a duration: use e.g. \"5m\", \"90s\", \"1h30m\", 0 or -1"),
    ("1s" * 40, 'keep_alive is not a duration (80 characters): use e.g. "5m", "90s", "1h30m", 0 or -1'),
])
def test_a_bad_keep_alive_is_refused_with_what_to_write(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_keep_alive(value)
    assert str(refused.value) == message


def test_keep_alive_described_as_the_model_list_and_the_banner_show_it() -> None:
    assert [describe_keep_alive(value) for value in (None, 0.0, 300.0, 2.5)] == [
        "never unloaded", "unloaded after each request", "unloaded after 300 s idle", "unloaded after 2.5 s idle"]


def test_keep_alive_durations_of_up_to_64_characters_are_read() -> None:
    assert parse_keep_alive("1s" * 32) == 32.0
    with pytest.raises(ValueError, match="65 characters"):
        parse_keep_alive("1s" * 32 + "1")


@pytest.mark.parametrize("value", ["1" * (1 << 20) + "x", "1s" * (1 << 19) + "x", "-" + "9" * 60 + "mx"])
def test_keep_alive_of_a_megabyte_is_refused_in_linear_time(value: str) -> None:
    # The hostile probe's 25,000 digits then `x` held the event loop 14-25 s with a rescanning regex: every JSON
    # route reads keep_alive. A megabyte of it now ends in one pass (this test would not end otherwise).
    with pytest.raises(ValueError, match="not a duration"):
        parse_keep_alive(value)


def test_memory_budget_sizes() -> None:
    """--memory-budget is pydantic's ByteSize: bytes, or decimal and binary units; positive."""
    assert Settings(memory_budget="3GiB").memory_budget == 3 * 1024**3
    assert Settings(memory_budget="1500MB").memory_budget == 1_500_000_000
    assert Settings(memory_budget=1024).memory_budget == 1024
    assert Settings(memory_budget="").memory_budget is None
    for wrong in ("lots", 0, "-1GB"):
        with pytest.raises(ValidationError):
            Settings(memory_budget=wrong)


# ---- what --models-dir serves ------------------------------------------------------------------------------


def served(tmp_path: Path, *files: str, **settings: Any) -> list[ModelSpec]:
    from edge_llm.config import Settings
    from edge_llm.registry.specs import model_specs

    for name in files:
        (tmp_path / name).write_bytes(b"GGUF" + bytes(64))  # unreadable headers: estimated by their size
    return model_specs(Settings(models_dir=tmp_path, **settings))


def test_the_default_model_comes_first_and_catalogue_names_and_aliases_are_names(tmp_path: Path) -> None:
    specs = served(tmp_path, "gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "zzz.gguf",
                   model_alias="coder", model_aliases={"tiny": "gemma-3-270m"}, pin=["zzz"])
    assert [s.name for s in specs] == ["qwen2.5-coder-0.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m", "zzz"]
    assert specs[0].aliases == ("coder",)
    assert specs[1].aliases == ("gemma-3-270m", "tiny")
    assert [s.pinned for s in specs] == [False, False, True]
    assert specs[2].memory_bytes == 68  # the file's size when the header cannot be read


def test_bad_aliases_and_pins_are_refused(tmp_path: Path) -> None:
    from edge_llm.registry.specs import ModelSpecError

    with pytest.raises(ModelSpecError, match="not a served model"):
        served(tmp_path, "a.gguf", model_aliases={"x": "b"})
    with pytest.raises(ModelSpecError, match="--pin names no served model: b"):
        served(tmp_path, "a.gguf", pin=["b"])
    with pytest.raises(ModelSpecError, match="no GGUF model files"):
        served(tmp_path / "a.gguf.d")


def test_edge_llm_models_dir_keeps_meaning_where_models_are_fetched(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    from edge_llm.config import Settings

    monkeypatch.setenv("EDGE_LLM_MODELS_DIR", str(tmp_path))
    assert Settings().models_dir is None
    assert Settings().model == tmp_path / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_a_serving_engines_death_is_fatal_a_failed_load_on_demand_is_not() -> None:
    factory = Factory()
    factory.gate("a").set()
    factory.gate("b").set()
    factory.failing.add("b")
    reg = registry(factory, spec("a"), spec("b"))
    deaths: list[BaseException] = []

    async def test() -> None:
        died = asyncio.Event()

        def fatal(error: BaseException) -> None:  # called on the event loop (call_soon_threadsafe)
            deaths.append(error)
            died.set()

        reg.on_fatal = fatal
        reg.start()
        with pytest.raises(ModelUnavailableError):
            await reg.acquire("b")
        failed_load = next(c for c in factory.made if c.name == "b")
        assert failed_load.exit_handler is not None
        failed_load.exit_handler(RuntimeError("bad magic"))  # as its engine thread reports the failed load
        (await reg.acquire("a")).release()
        serving = next(c for c in factory.made if c.name == "a")
        assert serving.exit_handler is not None
        serving.exit_handler(RuntimeError("llama_decode failed"))
        await asyncio.wait_for(died.wait(), 60)  # the report reaches the event loop on its next turn
        assert [str(d) for d in deaths] == ["llama_decode failed"]

    run(test)
