"""Model files: the default model (fetch, assemble, verify) and what a GGUF header says (edge-llm model info)."""
