"""Edge LLM Engine: a local, offline inference server for GGUF models."""

__version__ = "0.1.0"
