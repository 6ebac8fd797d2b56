"""The `gguf` package's tables (gguf/constants.py: value types, quantization block sizes, file types, key names)
without the package itself.

`import gguf` runs its __init__, which loads its reader, writer, vocabulary and metadata modules (PyYAML among
them): ~35 ms on the start-up's critical path, before the model load begins, for tables that live in one module
importing only the standard library. That module is loaded here alone, under a name of ours, so that a later
`import gguf` (tests, tools) is left as it was; its enums are IntEnums, equal to the same numbers of the package's.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

_NAME = "edge_llm.models._gguf_constants"


def _load() -> ModuleType:
    package = importlib.util.find_spec("gguf")  # locates the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    location = next(iter(package.submodule_search_locations))
    spec = importlib.util.spec_from_file_location(_NAME, f"{location}/constants.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"gguf/constants.py not found in {location}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses and enums look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_NAME]
        raise
    return module


_constants = _load()
GGML_QUANT_SIZES: dict = _constants.GGML_QUANT_SIZES
GGUF_MAGIC: int = _constants.GGUF_MAGIC
GGMLQuantizationType = _constants.GGMLQuantizationType
GGUFValueType = _constants.GGUFValueType
Keys = _constants.Keys
LlamaFileType = _constants.LlamaFileType
