"""Helpers for tests and benchmarks that run a real server (edge_llm.testing.server); not used by the server."""
