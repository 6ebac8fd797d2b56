"""Stored Responses: what `POST /v1/responses` keeps (unless `store: false`) for `previous_response_id`,
`GET /v1/responses/{id}`, `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.

In memory, least recently used dropped first, bounded by a count (`--responses-store-entries`) and by bytes
(`--responses-store-bytes`, the entries' JSON size): an entry holds the Response object and the whole input the
model saw (the earlier turns' items, then this turn's), so a chained turn needs nothing but its predecessor.
When API keys are on, each entry belongs to the key that made it and no other key can read or delete it.
Only the event loop touches the store, so it needs no lock.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request

logger = logging.getLogger(__name__)

# Where api/security.py's ApiKeyAuth leaves the identity of the key a request was let in with.
KEY_OWNER_STATE = "api_key_owner"


def key_owner(key: str) -> str:
    """A key's identity in the store: a digest, so the store holds no secret."""
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:32]


def request_owner(request: Request) -> str:
    """Whose responses a request may see: its API key's when keys are on, everybody's ("") otherwise."""
    return str(getattr(request.state, KEY_OWNER_STATE, ""))


@dataclass
class StoredResponse:
    owner: str
    response: dict[str, Any]  # the Response object, as GET /v1/responses/{id} answers it
    input_items: list[dict[str, Any]]  # the earlier turns' items, then this turn's input, each with an `id`
    size: int = 0

    def context(self) -> list[dict[str, Any]]:
        """The items a turn that continues this response starts with: its input, then its output."""
        return [*self.input_items, *self.response.get("output", [])]

    def measure(self) -> int:
        self.size = len(json.dumps(self.response, separators=(",", ":"))) + len(
            json.dumps(self.input_items, separators=(",", ":")))
        return self.size


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0
        self.evictions = {"entries": 0, "bytes": 0}

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> bool:
        """Keeps (or replaces) the entry under its response's id, dropping the least recently used ones as the bounds
        require; False when it alone is over the byte bound (then nothing is kept for it)."""
        response_id = str(entry.response["id"])
        previous = self._entries.pop(response_id, None)
        if previous is not None:
            self.bytes -= previous.size
        if not self.enabled or entry.measure() > self.max_bytes:
            if self.enabled:
                logger.warning("response %s not stored: its %d bytes exceed --responses-store-bytes %d",
                               response_id, entry.size, self.max_bytes)
            return False
        self._entries[response_id] = entry
        self.bytes += entry.size
        while len(self._entries) > self.max_entries:
            self._evict("entries")
        while self.bytes > self.max_bytes:
            self._evict("bytes")
        return True

    def update(self, response: dict[str, Any]) -> None:
        """A stored response's new state (its end); nothing when it was deleted or dropped meanwhile."""
        entry = self._entries.get(str(response["id"]))
        if entry is not None:
            self.put(StoredResponse(entry.owner, response, entry.input_items))

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:  # another key's: as if it did not exist
            return None
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, owner: str, response_id: str) -> bool:
        entry = self.get(owner, response_id)
        if entry is None:
            return False
        del self._entries[response_id]
        self.bytes -= entry.size
        return True

    def _evict(self, reason: str) -> None:
        _, entry = self._entries.popitem(last=False)
        self.bytes -= entry.size
        self.evictions[reason] += 1


class ResponseStoreCollector(Collector):
    """The store's figures, read when /metrics is scraped."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("edge_llm_stored_responses", "Responses kept for previous_response_id and "
                                "GET /v1/responses/{id}.", value=len(self.store))
        yield GaugeMetricFamily("edge_llm_stored_responses_bytes", "The stored responses' size (their JSON).",
                                value=self.store.bytes)
        evictions = CounterMetricFamily("edge_llm_stored_responses_evictions", "Stored responses dropped to stay "
                                        "within a bound, by the bound (entries, bytes).", labels=["bound"])
        for bound, count in self.store.evictions.items():
            evictions.add_metric([bound], count)
        yield evictions


__all__ = ["KEY_OWNER_STATE", "ResponseStore", "ResponseStoreCollector", "StoredResponse", "key_owner",
           "request_owner"]
