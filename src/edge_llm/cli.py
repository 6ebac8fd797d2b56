"""Command line: `edge-llm serve | model fetch | model info`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from edge_llm import __version__
from edge_llm.config import DEFAULT_MODEL_PATH, Settings, add_settings_arguments, settings_from_args

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
    fetch = model.add_parser("fetch", help="download, assemble and verify the default model (idempotent)")
    fetch.add_argument("--dir", type=Path, default=DEFAULT_MODEL_PATH.parent, help="where models live (models/)")
    fetch.set_defaults(handler=_fetch)

    # `edge-llm bench` parses its own flags (edge_llm.bench), so its imports stay out of `serve`.
    bench = commands.add_parser("bench", help="load-test an OpenAI-compatible server (edge-llm bench --help)",
                                add_help=False, prefix_chars="\0")
    bench.add_argument("bench_args", nargs="*")
    bench.set_defaults(handler=_bench)
    return parser


def _bench(args: argparse.Namespace) -> int:
    from edge_llm.bench import main as bench_main

    return bench_main(args.bench_args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _fail(message: str) -> int:
    sys.stderr.write(f"edge-llm: error: {message}\n")
    return 1


def _fetch(args: argparse.Namespace) -> int:
    from edge_llm.models import DEFAULT_MODEL, ModelFileError, fetch

    _configure_logging("info")
    bar = _ProgressBar("assembling " + DEFAULT_MODEL.filename)
    try:
        path = fetch(DEFAULT_MODEL, args.dir, progress=bar.update)
    except ModelFileError as exc:
        return _fail(str(exc))
    finally:
        bar.close()
    sys.stderr.write(f"model ready: {path} (sha256 verified)\n")
    return 0


class _ProgressBar:
    def __init__(self, label: str) -> None:
        self.label = label
        self._last = -1
        self._shown = False

    def update(self, done: int, total: int) -> None:
        percent = done * 100 // max(total, 1)
        if percent != self._last:
            self._last = percent
            self._shown = True
            filled = percent // 4
            sys.stderr.write(
                f"\r{self.label} [{'#' * filled}{'.' * (25 - filled)}] {percent:3d}% "
                f"{done / 1e6:.0f}/{total / 1e6:.0f} MB"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        return _fail(f"invalid setting {'.'.join(map(str, first['loc']))}: {first['msg']}")
    _configure_logging(settings.log_level)

    from edge_llm.models import ModelFileError, check_model_file

    try:
        check_model_file(settings.model)
    except ModelFileError as exc:
        return _fail(str(exc))
    return _run_server(settings)


def _run_server(settings: Settings) -> int:
    import uvicorn

    from edge_llm.api.app import create_app
    from edge_llm.engine.worker import Engine

    engine = Engine(
        _runner_factory(settings),
        n_ctx=settings.ctx_size,
        batch_size=settings.batch_size,
        parallel=settings.parallel,
        cache_slots=settings.cache_slots,
        queue_capacity=settings.queue_capacity,
    )
    logger.info("loading %s", settings.model)
    engine.start()
    engine.wait_loaded()
    if engine.failure is not None:
        return _fail(" ".join(str(engine.failure).split()))
    app = create_app(settings, engine)
    logger.info(
        "serving %s on http://%s:%d (ctx %d, parallel %d, threads %d)",
        settings.model_name, settings.host, settings.port, settings.ctx_size, settings.parallel, settings.threads,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        engine.stop()
    if not server.started:
        return _fail(f"could not listen on {settings.host}:{settings.port} (is the port in use?)")
    return int(getattr(app.state, "exit_code", 0))


def _runner_factory(settings: Settings):  # type: ignore[no-untyped-def]
    def load():  # type: ignore[no-untyped-def]
        from edge_llm.engine.runner import ContextConfig, LlamaRunner

        return LlamaRunner(
            settings.model,
            ContextConfig(
                n_ctx=settings.ctx_size,
                n_batch=settings.batch_size,
                n_seq_max=settings.parallel + settings.cache_slots,
                n_threads=settings.threads,
                n_threads_batch=settings.threads_batch or settings.threads,
            ),
        )

    return load
