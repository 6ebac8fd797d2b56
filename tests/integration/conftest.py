from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from edge_llm.testing.server import MODEL_ID, RunningServer, run_server
from tests.server_pool import DEFAULT_FLAGS, REPEATABLE_FLAGS, SMALL_CHUNK, ServerWith


@pytest.fixture(scope="session")
def server(server_with: ServerWith) -> RunningServer:
    """The default server: 4 parallel sequences, prefix cache on."""
    return server_with(*DEFAULT_FLAGS, keep=True)


@pytest.fixture(scope="session")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def repeatable_server(server_with: ServerWith) -> RunningServer:
    """One sequence at a time and no prefix cache: every request is prefilled cold and alone, in the same chunks,
    so the same temperature-0 or seeded request gives the same text every time, streamed or not.
    Only here may a test compare the exact text of two requests (see docs/architecture.md, Repeatability)."""
    return server_with(*REPEATABLE_FLAGS, keep=True)


@pytest.fixture(scope="session")
def repeatable_client(repeatable_server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=repeatable_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def small_chunks_server(server_with: ServerWith) -> RunningServer:
    """The default server with prompts prefilled in chunks of 64 tokens (--batch-size 64): a prompt of a few hundred
    tokens moves through many chunks, so the tests of what a stream shows while its prompt is prefilled need no
    long prompt. Shared by those tests in several modules."""
    return server_with(*DEFAULT_FLAGS, "--batch-size", str(SMALL_CHUNK), keep=True)


@pytest.fixture(scope="session")
def model_id() -> str:
    return MODEL_ID


@pytest.fixture(scope="module")
def serial_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One sequence at a time, one waiting slot, a small context: for queueing and capping tests."""
    with run_server(tmp_path_factory.mktemp("serial"), "--parallel", "1", "--queue-capacity", "1",
                    "--ctx-size", "512", "--cache-slots", "0") as running:
        yield running
