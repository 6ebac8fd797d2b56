"""Command line: `edge-llm serve | chat | model list | model fetch | model info | bench`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edge_llm import __version__
from edge_llm.config import Settings, add_settings_arguments, logit_rows, settings_from_args
from edge_llm.models.fetch import MODELS_DIR_ENV, default_model_path, models_dir

if TYPE_CHECKING:
    from edge_llm.engine.llama.loading import EarlyLoad

logger = logging.getLogger("edge_llm.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-llm", description="Edge LLM Engine: serve GGUF models locally.")
    parser.add_argument("--version", action="version", version=f"edge-llm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="serve a GGUF model over an OpenAI-compatible HTTP API",
        description="Serve a GGUF model. Every flag is also an EDGE_LLM_* environment variable; "
        "precedence: flags > environment > --config file > defaults.",
    )
    add_settings_arguments(serve)
    serve.set_defaults(handler=_serve)

    model = commands.add_parser("model", help="fetch or inspect models").add_subparsers(dest="model_command",
                                                                                        required=True)
    where_help = (f"the models directory (default: {models_dir()}, where `edge-llm serve` looks: ${MODELS_DIR_ENV}, "
                  "else $XDG_DATA_HOME/edge-llm/models, else ~/.local/share/edge-llm/models)")
    listing = model.add_parser("list", help="the models that can be fetched and those present in the models directory")
    listing.add_argument("--dir", type=Path, default=None, help=where_help)
    listing.set_defaults(handler=_model_list)
    fetch = model.add_parser("fetch", help="download, assemble and verify a catalogued model (idempotent)")
    fetch.add_argument("names", nargs="*", metavar="NAME",
                       help="catalogued models to fetch (`edge-llm model list`; default: the default model)")
    fetch.add_argument("--dir", type=Path, default=None, help="where to put it: " + where_help)
    fetch.set_defaults(handler=_fetch)
    info = model.add_parser("info", help="what a GGUF file holds and the memory it needs (reads the header only)")
    info.add_argument("path", type=Path, nargs="?", default=None,
                      help=f"the GGUF file (default: the default model, {default_model_path()})")
    info.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    info.add_argument("--ctx", type=int, default=8192, metavar="N", help="context size for the memory estimate")
    from edge_llm.engine.llama.kv_types import KV_TYPES

    for which in ("k", "v"):
        info.add_argument(f"--cache-type-{which}", choices=tuple(KV_TYPES), default="f16", metavar="TYPE",
                          help=f"KV cache type of the {'keys' if which == 'k' else 'values'} for the memory "
                          f"estimate, as `serve --cache-type-{which}` (default: %(default)s; {', '.join(KV_TYPES)})")
    info.set_defaults(handler=_model_info)

    chat = commands.add_parser("chat", help="chat with a running server in the terminal (or one-shot with -p)",
                               description="Interactive terminal chat; /help inside lists the commands.")
    from edge_llm.cli.chat import add_arguments as add_chat_arguments

    add_chat_arguments(chat)
    chat.set_defaults(handler=_chat)

    from edge_llm.cli.ollama_verbs import add_verbs

    add_verbs(commands)  # run, pull, list, ps: Ollama's verbs, talking to a running server

    # `edge-llm bench` parses its own flags (edge_llm.cli.bench), so its imports stay out of `serve`.
    bench = commands.add_parser("bench", help="load-test an OpenAI-compatible server (edge-llm bench --help)",
                                add_help=False, prefix_chars="\0")
    bench.add_argument("bench_args", nargs="*")
    bench.set_defaults(handler=_bench)
    return parser


def _chat(args: argparse.Namespace) -> int:
    from edge_llm.cli.chat import main as chat_main

    return chat_main(args)


def _bench(args: argparse.Namespace) -> int:
    from edge_llm.cli.bench import main as bench_main

    return bench_main(args.bench_args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def _configure_logging(level: str, fmt: str = "text") -> None:
    from edge_llm.logs import configure_logging

    configure_logging(level, fmt, sys.stderr)


def _fail(message: str) -> int:
    sys.stderr.write(f"edge-llm: error: {message}\n")
    return 1


def _model_info(args: argparse.Namespace) -> int:
    from edge_llm.models.gguf_report import run_info

    defaults = Settings.model_fields
    return run_info(args.path or default_model_path(), as_json=args.json, n_ctx=args.ctx,
                    logit_rows=logit_rows(parallel=defaults["parallel"].default,
                                          cache_slots=defaults["cache_slots"].default,
                                          batch_size=defaults["batch_size"].default,
                                          speculative=defaults["speculative"].default == "ngram"),
                    cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)


def _model_list(args: argparse.Namespace) -> int:
    from edge_llm.models.catalogue import CATALOGUE, catalogue_name_of
    from edge_llm.models.fetch import DEFAULT_MODEL, is_present
    from edge_llm.models.gguf_report import human_bytes

    directory = args.dir or models_dir()
    print(f"catalogue (edge-llm model fetch NAME), into {directory}:")
    for entry in CATALOGUE:
        state = "present" if is_present(entry, directory) else "not fetched"
        default = ", the default" if entry is DEFAULT_MODEL else ""
        print(f"  {entry.catalogue_name:<38} {human_bytes(entry.size):>10}  {state}{default}")
        print(f"  {'':<38} {entry.description}")
    others = sorted(p for p in directory.glob("*.gguf") if p.is_file() and catalogue_name_of(p.name) is None)
    if others:
        print(f"other GGUF files in {directory} (served by `edge-llm serve --models-dir {directory}`):")
        for path in others:
            print(f"  {path.name.removesuffix('.gguf'):<38} {human_bytes(path.stat().st_size):>10}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from edge_llm.cli.progress import ProgressBar
    from edge_llm.models.catalogue import CATALOGUE, UnknownCatalogueModel, find
    from edge_llm.models.fetch import DEFAULT_MODEL, ModelFileError, fetch

    _configure_logging("info")
    try:
        wanted = [find(name) for name in args.names] or [DEFAULT_MODEL]
    except UnknownCatalogueModel as exc:
        names = ", ".join(entry.catalogue_name for entry in CATALOGUE)
        return _fail(f"no model called {exc.args[0]!r} in the catalogue; it has: {names}")
    for entry in wanted:
        bar = ProgressBar("assembling " + entry.filename, scale=1e6, unit=" MB")
        try:
            path = fetch(entry, args.dir or models_dir(), progress=bar)
        except ModelFileError as exc:
            return _fail(str(exc))
        finally:
            bar.close()
        where = ("" if path.absolute() == default_model_path()
                 else f"; serve it with --model {path}, or every model there with --models-dir {path.parent}")
        sys.stderr.write(f"model ready: {path} (sha256 verified{where})\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:  # a rule across settings (a model validator): its message names the flags
            return _fail(str(first["msg"]).removeprefix("Value error, "))
        return _fail(f"invalid setting {'.'.join(map(str, first['loc']))}: {first['msg']}")
    _configure_logging(settings.log_level, settings.log_format)
    from edge_llm.cli.preflight import preflight

    problem = preflight(settings)  # model missing or not GGUF, port taken, not enough memory for the context
    if problem is not None:
        return _fail(problem)
    return _run_server(settings)


_GIL_SWITCH_INTERVAL = 0.001  # seconds


def _run_server(settings: Settings) -> int:
    """Listens at once (/healthz 200; with --model alone /readyz 503 "loading" while the engine thread loads it)."""
    # The event loop shares the GIL with the tokenizer thread's Python work (templates, grammars, schemas): with
    # the default 5 ms hand-over, each of the loop's several GIL waits per request costs up to 5 ms, and /healthz
    # took 160-280 ms beside a megabyte prompt; 1 ms keeps the loop's answers prompt (issue 41).
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL)
    early = None
    if settings.models_dir is None:  # one model, loaded at start-up: its file loads from now on (EarlyLoad)
        from edge_llm.engine.llama.loading import EarlyLoad

        early = EarlyLoad(settings.model.absolute(), deterministic=settings.deterministic)
    try:
        return _serve_registry(settings, early)
    finally:
        if early is not None:
            early.close()  # frees the model if the start-up failed before the engine took it


def _serve_registry(settings: Settings, early: EarlyLoad | None) -> int:
    from edge_llm.cli.preflight import memory_budget
    from edge_llm.registry.setup import build_registry
    from edge_llm.registry.specs import ModelSpecError

    try:
        registry = build_registry(settings, _engine_factory(settings, early), default_budget=memory_budget())
    except (ModelSpecError, ValueError) as exc:
        return _fail(str(exc))
    if not registry.on_demand:
        # Imported here, first: on the engine thread this import (~0.1 s of Python) would share the GIL with the API's
        # import and create the context (C, without the GIL) later by as much (issue 40).
        import edge_llm.engine.llama.runner  # noqa: F401
    registry.preload()  # the engine thread takes the model and makes its context while the API is imported
    from edge_llm.api.app import create_app
    from edge_llm.cli.banner import log_banner, log_models_banner

    try:
        app = create_app(settings, registry=registry)
    except (ModelSpecError, ValueError) as exc:
        registry.close()
        return _fail(str(exc))
    if registry.on_demand:
        log_models_banner(settings, registry)
    else:
        log_banner(settings)  # "serving ... on URL; loading the model", with quantization, memory, web chat, curl
    server = _graceful_server(app, settings)
    try:
        server.run()
    finally:
        registry.close()
    if not server.started:
        return _fail(f"could not listen on {settings.host}:{settings.port} (is the port in use?)")
    return int(getattr(app.state, "exit_code", 0))


def _graceful_server(app, settings: Settings):  # type: ignore[no-untyped-def]
    """uvicorn's server, with SIGTERM/SIGINT handed to the app's drain (edge_llm.api.lifecycle)."""
    import asyncio
    import signal

    import uvicorn

    from edge_llm.api.connections import ConnectionLimits, connection_cap, protocol_class

    lifecycle = app.state.lifecycle

    class GracefulServer(uvicorn.Server):
        _loop: asyncio.AbstractEventLoop | None = None

        _exit_asked: asyncio.Event | None = None

        async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
            self._loop = asyncio.get_running_loop()
            self._exit_asked = asyncio.Event()
            await super().serve(sockets)

        async def main_loop(self) -> None:
            # uvicorn's loop wakes every 0.1 s to refresh its Date header and look at should_exit: CPU used while
            # idle. This one sleeps until an exit is asked for (the Date header: api/middleware.py).
            await self.on_tick(0)
            assert self._exit_asked is not None
            await self._exit_asked.wait()

        def ask_exit(self) -> None:  # any thread
            self.should_exit = True
            if self._loop is not None and self._exit_asked is not None:
                self._loop.call_soon_threadsafe(self._exit_asked.set)

        def handle_exit(self, sig: int, frame) -> None:  # type: ignore[no-untyped-def]
            # Not recorded in uvicorn's captured signals: it would re-raise them after shutdown and the
            # process would end by the signal instead of with its exit code.
            if self.should_exit or self._loop is None:
                self.force_exit = self.should_exit
                self.ask_exit()
                return
            self._loop.call_soon_threadsafe(lifecycle.shutdown, signal.Signals(sig).name)

    limits = ConnectionLimits(settings.head_timeout, settings.body_timeout, connection_cap(settings.max_connections))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # h11 bounds an incomplete request head's size (HeaderLimit checks complete ones); the protocol class adds
        # head/body timeouts and the connection cap
        http=protocol_class(limits, app.state.metrics.connections_closed),
        h11_max_incomplete_event_size=2 * settings.max_header_bytes,
        log_config=None,
        access_log=False,  # edge_llm.access writes one line per request
        date_header=False,  # api/middleware.py writes it
        timeout_graceful_shutdown=5,  # after the drain, for connections still closing
    )
    server = GracefulServer(config)

    lifecycle.request_exit = server.ask_exit
    return server


def _engine_factory(settings: Settings, early: EarlyLoad | None = None):  # type: ignore[no-untyped-def]
    """Makes one model's engine (not started: the registry starts it, which loads the model, or takes `early`'s)."""
    from edge_llm.engine.facade import EngineClient
    from edge_llm.engine.thread.worker import Engine
    from edge_llm.registry.specs import ModelSpec

    def make(spec: ModelSpec) -> EngineClient:
        return EngineClient(Engine(
            _runner_factory(settings, spec.path, spec.name if settings.models_dir is not None else None, early),
            n_ctx=settings.kv_cells,
            stream_cells=settings.stream_cells,
            batch_size=settings.batch_size,
            parallel=settings.parallel,
            cache_slots=settings.cache_slots,
            queue_capacity=settings.queue_capacity,
            request_timeout=settings.request_timeout,
            keep_text=settings.log_prompts,
            speculative=settings.speculative == "ngram",
            kv_bytes_per_cell=_kv_bytes_per_cell(settings, spec.path),
            disk_cache=_disk_cache(settings, spec.path, spec.name),
            watchdog_seconds=settings.watchdog_seconds,
        ))

    return make


def _runner_factory(settings: Settings, path: Path, log_name: str | None,  # type: ignore[no-untyped-def]
                    early: EarlyLoad | None):
    def load():  # type: ignore[no-untyped-def]  # on the engine thread
        from edge_llm.engine.llama.runner import ContextConfig, LlamaRunner
        from edge_llm.logs import bind_model

        if log_name is not None:
            bind_model(log_name)  # every line this engine thread logs names its model
        return LlamaRunner(
            path,
            ContextConfig(
                n_ctx=settings.kv_cells,
                n_batch=settings.batch_size,
                n_seq_max=settings.parallel + settings.cache_slots,
                n_threads=settings.threads,
                n_threads_batch=settings.threads_batch or settings.threads,
                cache_type_k=settings.cache_type_k,
                cache_type_v=settings.cache_type_v,
                flash_attn=settings.flash_attn,
                logit_rows=settings.logit_rows,
                deterministic=settings.deterministic,
                grammar_step_budget=settings.grammar_step_budget_ms / 1000,
            ),
            model=early.take(path) if early is not None else None,
        )

    return load


def _kv_bytes_per_cell(settings: Settings, path: Path) -> int:
    from edge_llm.cli.preflight import model_facts

    facts = model_facts(path)
    return facts.kv_bytes_per_token(settings.cache_type_k, settings.cache_type_v) if facts else 0


def _disk_cache(settings: Settings, path: Path, name: str):  # type: ignore[no-untyped-def]
    """The persistent prefix cache (engine/prefix_cache/disk.py) when --prefix-cache-dir is set; with --models-dir, a
    folder of it per model (each under the whole disk budget)."""
    if settings.prefix_cache_dir is None:
        return None
    from edge_llm.engine.prefix_cache.disk import DiskPrefixCache
    from edge_llm.engine.prefix_cache.store import PrefixStore, kv_fingerprint

    directory = settings.prefix_cache_dir if settings.models_dir is None else settings.prefix_cache_dir / name
    fingerprint = kv_fingerprint(path, cache_type_k=settings.cache_type_k,
                                 cache_type_v=settings.cache_type_v, flash_attn=settings.flash_attn,
                                 deterministic=settings.deterministic)
    store = PrefixStore(directory, fingerprint, budget_bytes=int(settings.prefix_cache_disk_budget))
    return DiskPrefixCache(store, min_new_tokens=settings.prefix_cache_min_tokens)
