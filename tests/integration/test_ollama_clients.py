"""Apps built on Ollama's API, pointed at this server: the official `ollama` JavaScript package (run with the
machine's node; scripts/bootstrap.sh test installs the pinned package into tests/integration/ollama_js) and
LangChain's ChatOllama (`langchain-ollama`, which sends every chat streamed, through ollama-python)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_ollama import ChatOllama
from pydantic import BaseModel

from edge_llm.testing.server import RunningServer

pytestmark = pytest.mark.integration

JS_CLIENT = Path(__file__).parent / "ollama_js"
TIMEOUT = 300


def test_the_ollama_javascript_package_streams_a_chat_and_generates(server: RunningServer, model_id: str) -> None:
    installed = JS_CLIENT / "node_modules" / "ollama" / "package.json"
    assert installed.is_file(), "the ollama npm package is missing: run scripts/bootstrap.sh test (it installs it)"
    pinned = json.loads((JS_CLIENT / "package.json").read_text())["dependencies"]["ollama"]
    assert json.loads(installed.read_text())["version"] == pinned
    run = subprocess.run(["node", "client.mjs", server.url, model_id], cwd=JS_CLIENT, capture_output=True, text=True,
                         timeout=TIMEOUT, check=False)
    assert run.returncode == 0 and not run.stderr, run.stderr  # the package warns on stderr of any line not JSON
    result = json.loads(run.stdout)
    assert len(result["pieces"]) > 1 and "1" in "".join(result["pieces"]), result
    last = result["last"]
    assert last["done"] is True and last["message"] == {"role": "assistant", "content": ""}, last
    assert last["eval_count"] >= len(result["pieces"]), last
    generated = result["generated"]
    assert generated["done"] is True and generated["response"].strip() and generated["eval_count"] <= 6, generated


@pytest.fixture(scope="module")
def chat_model(server: RunningServer, model_id: str) -> ChatOllama:
    return ChatOllama(model=model_id, base_url=server.url, temperature=0, num_predict=60,
                      client_kwargs={"timeout": TIMEOUT})


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return "sunny, 21 C"


class Pet(BaseModel):
    name: str
    age: int


def test_chat_ollama_invokes_and_streams(chat_model: ChatOllama, model_id: str) -> None:
    message = chat_model.invoke("Say hello in three words.")
    assert isinstance(message, AIMessage) and message.content.strip()
    assert message.usage_metadata is not None and message.usage_metadata["input_tokens"] > 0
    assert message.usage_metadata["output_tokens"] > 0
    assert message.response_metadata["model"] == model_id and message.response_metadata["done_reason"] == "stop"
    chunks = list(chat_model.stream("Count from 1 to 5, separated by spaces."))
    assert len(chunks) > 2 and "1" in "".join(str(chunk.content) for chunk in chunks)


def test_chat_ollama_binds_tools_and_takes_the_result_back(chat_model: ChatOllama) -> None:
    with_tools = chat_model.bind_tools([get_weather])
    ask = HumanMessage("What is the weather in Paris? Use the tool.")
    called = with_tools.invoke([ask])
    assert [call["name"] for call in called.tool_calls] == ["get_weather"], called
    assert isinstance(called.tool_calls[0]["args"], dict) and "city" in called.tool_calls[0]["args"]
    result = ToolMessage("sunny, 21 C", tool_call_id=called.tool_calls[0]["id"])
    answered = chat_model.invoke([ask, called, result])  # the tools are not offered again: the model answers
    assert isinstance(answered.content, str) and answered.content.strip() and not answered.tool_calls


def test_chat_ollama_structured_output_follows_the_schema(chat_model: ChatOllama) -> None:
    pet = chat_model.with_structured_output(Pet).invoke("A pet named Rex, aged 3.")
    assert isinstance(pet, Pet) and pet.name and pet.age >= 0
