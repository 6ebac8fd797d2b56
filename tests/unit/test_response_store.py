"""The stored Responses' bounds, owners and figures (api/response_store.py), and how a turn's input is kept."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from edge_llm.api.protocol.responses import ResponsesRequest
from edge_llm.api.response_store import ResponseStore, ResponseStoreCollector, StoredResponse, key_owner
from edge_llm.api.serving.stored_responses import stored_items


def entry(response_id: str, text: str = "x", owner: str = "") -> StoredResponse:
    response = {"id": response_id, "status": "completed",
                "output": [{"id": "msg_" + response_id, "type": "message", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}]}
    return StoredResponse(owner, response, [{"id": "in_" + response_id, "type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": "hi"}]}])


def test_the_least_recently_used_goes_first_when_the_count_is_reached() -> None:
    store = ResponseStore(max_entries=2, max_bytes=1 << 20)
    store.put(entry("a"))
    store.put(entry("b"))
    assert store.get("", "a") is not None  # a is now the most recently used
    store.put(entry("c"))
    assert store.get("", "b") is None and store.get("", "a") is not None and store.get("", "c") is not None
    assert len(store) == 2 and store.evictions == {"entries": 1, "bytes": 0}


def test_the_byte_bound_drops_old_entries_and_refuses_one_too_big_alone() -> None:
    one = entry("a", "y" * 1000).measure()
    store = ResponseStore(max_entries=100, max_bytes=one * 2 + 10)
    for name in "abc":
        assert store.put(entry(name, "y" * 1000))
    assert store.get("", "a") is None and len(store) == 2 and store.bytes == 2 * one
    assert store.evictions["bytes"] == 1
    assert not store.put(entry("huge", "y" * 10_000)) and store.get("", "huge") is None
    assert store.bytes == sum(stored.size for stored in (store.get("", "b"), store.get("", "c")) if stored)


def test_an_update_replaces_the_entry_and_its_size_and_a_deleted_one_stays_deleted() -> None:
    store = ResponseStore(max_entries=10, max_bytes=1 << 20)
    store.put(StoredResponse("", {"id": "a", "status": "in_progress", "output": []}, []))
    finished = entry("a", "z" * 500).response
    store.update(finished)
    kept = store.get("", "a")
    assert kept is not None and kept.response["status"] == "completed" and store.bytes == kept.size > 500
    assert kept.context()[-1]["content"][0]["text"] == "z" * 500
    assert store.delete("", "a") and not store.delete("", "a") and store.bytes == 0
    store.update(finished)  # the end of a response deleted meanwhile keeps nothing
    assert store.get("", "a") is None


def test_another_key_cannot_read_or_delete_an_entry() -> None:
    store = ResponseStore(max_entries=10, max_bytes=1 << 20)
    mine, theirs = key_owner("sk-one"), key_owner("sk-two")
    store.put(entry("a", owner=mine))
    assert store.get(theirs, "a") is None and not store.delete(theirs, "a")
    assert store.get(mine, "a") is not None
    assert "sk-one" not in mine  # the store holds digests, not keys


def test_zero_entries_keeps_nothing() -> None:
    store = ResponseStore(max_entries=0, max_bytes=1 << 20)
    assert not store.enabled and not store.put(entry("a")) and len(store) == 0


def test_the_figures_are_exported() -> None:
    store = ResponseStore(max_entries=1, max_bytes=1 << 20)
    store.put(entry("a"))
    store.put(entry("b"))
    registry = CollectorRegistry()
    registry.register(ResponseStoreCollector(store))
    text = generate_latest(registry).decode()
    assert "edge_llm_stored_responses 1.0" in text
    assert f"edge_llm_stored_responses_bytes {float(store.bytes)}" in text
    assert 'edge_llm_stored_responses_evictions_total{bound="entries"} 1.0' in text


def test_a_turn_s_input_is_kept_as_openai_lists_input_items() -> None:
    body: dict[str, Any] = {"input": [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": "hello"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_given"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    items = stored_items(ResponsesRequest.model_validate(body))
    assert [item["type"] for item in items] == ["message", "message", "function_call", "function_call_output"]
    assert items[0]["content"] == [{"type": "input_text", "text": "hi"}] and items[0]["id"].startswith("msg_")
    assert items[1]["content"] == [{"type": "output_text", "text": "hello"}]
    assert items[2]["id"] == "fc_given" and len({item["id"] for item in items}) == 4
    assert all(item["status"] == "completed" for item in items)
    assert stored_items(ResponsesRequest.model_validate({"input": "just text"}))[0]["role"] == "user"
