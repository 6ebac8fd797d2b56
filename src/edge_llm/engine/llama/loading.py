"""llama.cpp's log lines routed to Python logging, and a model and its context created without holding up the process.

While it loads, llama.cpp calls back hundreds of times (a log line and a progress fraction per tensor). A Python
callback takes the GIL, which costs up to a switch interval (5 ms) whenever another thread runs Python: at start-up
the API is imported beside the load, and a 0.5 s load took 2 to 5 s. So below --log-level debug the load runs with C
functions in those places (libc's `abs` ignores a log line; `strlen` of a non-empty string answers "go on"), a timer
says "still loading" every few seconds, and a load that fails is tried again with llama.cpp's lines on, so that the
log says why. The log callback is process-wide: a warning another model's thread logs during those moments is lost.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from edge_llm.engine.llama.bindings import llama_cpp

logger = logging.getLogger(__name__)
_llama_logger = logging.getLogger("edge_llm.llama_cpp")
_thread_state = threading.local()  # `expected_failure` while the engine thread makes llama.cpp fail on purpose

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line
_GGML_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}
_STILL_LOADING_EVERY_S = 5.0


@llama_cpp.llama_log_callback
def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at info level; its info lines go to debug so that a normal run stays readable.
    python_level = _GGML_LEVELS.get(level, logging.DEBUG)
    if getattr(_thread_state, "expected_failure", False):
        python_level = logging.DEBUG
    if _llama_logger.isEnabledFor(python_level):
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:
            _llama_logger.log(python_level, "%s", message)


llama_cpp.llama_log_set(_route_llama_log, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()

_LIBC = ctypes.CDLL(None)
STRLEN_ADDRESS = ctypes.cast(_LIBC.strlen, ctypes.c_void_p).value
_IGNORE_LOG_LINE = llama_cpp.llama_log_callback(ctypes.cast(_LIBC.abs, ctypes.c_void_p).value)
_GO_ON = llama_cpp.llama_progress_callback(STRLEN_ADDRESS)
_NON_EMPTY = ctypes.create_string_buffer(b"1")
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc's

Handle = TypeVar("Handle")


class ModelLoadError(RuntimeError):
    pass


@contextmanager
def expected_failure() -> Iterator[None]:
    """llama.cpp's error lines on this thread go to debug: the caller makes it fail on purpose."""
    _thread_state.expected_failure = True
    try:
        yield
    finally:
        _thread_state.expected_failure = False


def model_params(*, deterministic: bool) -> llama_cpp.llama_model_params:
    params = llama_cpp.llama_model_default_params()
    # Repacked weights take a 4-row GEMM for groups of rows and a GEMV for the rest: batch-dependent rounding.
    params.use_extra_bufts = not deterministic
    return params


class EarlyLoad:
    """The served model's file loading on a thread of its own from the moment the settings are checked (issue 40).
    The load is C without the GIL, so the rest of the start-up (the engine's and the API's imports, ~0.2 s of Python
    on 2 cores) runs beside it instead of before it. The engine's runner takes the model (`take`), as it would have
    loaded it; `close` frees a model that nobody took (a start-up that failed after the load began)."""

    def __init__(self, path: Path, *, deterministic: bool) -> None:
        self.path = path
        self._params = model_params(deterministic=deterministic)
        self._model: llama_cpp.llama_model_p | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._lock = threading.Lock()
        logger.debug("loading %s", path)
        self._thread = threading.Thread(target=self._load, name="edge-llm-model-load", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            self._model = load_model(self.path, self._params)
            if _MALLOC_TRIM is not None:
                # The loader's temporaries were freed into this thread's own malloc arena, which keeps them: 4 MiB
                # of RssAnon more than a load on the engine thread, 2 MiB less once trimmed (measured, issue 40).
                _MALLOC_TRIM(0)
        except BaseException as exc:  # noqa: BLE001 - raised again by `take`, in the engine thread
            self._error = exc

    def take(self, path: Path) -> llama_cpp.llama_model_p | None:
        """The loaded model once it is loaded (raises the load's ModelLoadError); None for another file or after the
        first call (a later load of the same model, after an unload, loads it again)."""
        with self._lock:
            if self._taken or path != self.path:
                return None
            self._taken = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._model

    def close(self) -> None:
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self._thread.join()
        if self._model:
            llama_cpp.llama_model_free(self._model)


def load_model(path: Path, params: llama_cpp.llama_model_params) -> llama_cpp.llama_model_p:
    params.progress_callback = _GO_ON
    params.progress_callback_user_data = ctypes.cast(_NON_EMPTY, ctypes.c_void_p)
    with _still_loading(path.name):
        model = _without_python_callbacks(lambda: llama_cpp.llama_model_load_from_file(str(path).encode(), params))
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {path} (corrupt, truncated or unsupported GGUF)")
    return model


def create_context(model: llama_cpp.llama_model_p,
                   params: llama_cpp.llama_context_params) -> llama_cpp.llama_context_p | None:
    return _without_python_callbacks(lambda: llama_cpp.llama_init_from_model(model, params))


def _without_python_callbacks(create: Callable[[], Handle]) -> Handle:
    if _llama_logger.isEnabledFor(logging.DEBUG):
        return create()
    llama_cpp.llama_log_set(_IGNORE_LOG_LINE, ctypes.c_void_p(0))
    try:
        handle = create()
    finally:
        llama_cpp.llama_log_set(_route_llama_log, ctypes.c_void_p(0))
    return handle or create()  # a failure again, this time with llama.cpp's lines saying why


@contextmanager
def _still_loading(name: str) -> Iterator[None]:
    done = threading.Event()

    def report() -> None:
        waited = 0.0
        while not done.wait(_STILL_LOADING_EVERY_S):
            waited += _STILL_LOADING_EVERY_S
            logger.info("still loading %s (%.0f s)", name, waited)

    reporter = threading.Thread(target=report, name="edge-llm-load-report", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()
