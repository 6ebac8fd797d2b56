"""llama.cpp's C API as llama-cpp-python binds it (`llama_cpp.llama_cpp`, ctypes), without the package's high-level
API, which is all that `engine/llama/` uses.

`import llama_cpp` runs the package's __init__, which also imports its `Llama` class and, with it, its chat formats
(Jinja), its disk cache (diskcache, sqlite3) and its speculative decoding: ~0.1 s of Python on the start-up's
critical path, before the model load can begin (issue 40). Here the package is registered without running its
__init__, and the bindings module is imported alone. The package's other names are still there for whoever asks:
the first missing attribute runs the real __init__ in the same module (tests, tools in this process).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

_PACKAGE = "llama_cpp"


def _package_without_init() -> None:
    if _PACKAGE in sys.modules:  # imported already, in full or by this module
        return
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.loader is None:
        raise ImportError("llama-cpp-python is not installed")
    package = importlib.util.module_from_spec(spec)
    completed = False

    def complete(name: str) -> Any:
        nonlocal completed
        if completed or name.startswith("__"):
            raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
        if importlib.util.find_spec(f"{_PACKAGE}.{name}") is not None:  # `from llama_cpp import llama_grammar`
            return importlib.import_module(f"{_PACKAGE}.{name}")
        completed = True
        spec.loader.exec_module(package)  # type: ignore[union-attr]
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]  # PEP 562: asked for a name not yet there
    sys.modules[_PACKAGE] = package


_package_without_init()
llama_cpp: ModuleType = importlib.import_module(f"{_PACKAGE}.llama_cpp")
