"""Stored Responses on the wire: what `POST /v1/responses` keeps and continues from, and `GET` / `DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items` (the store itself: api/response_store.py).

A response is kept from its start (`status: in_progress`, as OpenAI lists a response still being written) and
replaced by its final state at the end; a client that leaves first leaves it `cancelled`. Another API key's
response, like an unknown, deleted or dropped one, is a 404.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from fastapi import Request
from fastapi.responses import JSONResponse

from edge_llm.api.errors import APIError, invalid_request
from edge_llm.api.protocol.responses_answers import deleted, item_list
from edge_llm.api.protocol.responses import MessageItem, ReasoningItem, ResponsesRequest
from edge_llm.api.response_store import ResponseStore, StoredResponse, request_owner
from edge_llm.api.serving.responses_events import new_id

logger = logging.getLogger(__name__)

_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
_MAX_LIST = 100  # OpenAI's bound on `limit`


def response_store(request: Request) -> ResponseStore:
    return cast(ResponseStore, request.app.state.response_store)


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", error_type="invalid_request_error",
                    code="response_not_found")


def previous_context(request: Request, body: ResponsesRequest) -> list[dict[str, Any]]:
    """The items of the stored response the body continues (its input, then its output); none without
    `previous_response_id`."""
    response_id = body.previous_response_id
    if response_id is None:
        return []
    entry = response_store(request).get(request_owner(request), response_id)
    if entry is None:
        raise APIError(404, f"Previous response with id '{response_id}' not found.", param="previous_response_id",
                       error_type="invalid_request_error", code="previous_response_not_found")
    if entry.response["status"] == "in_progress":
        raise invalid_request(f"Previous response with id '{response_id}' is still in progress.",
                              param="previous_response_id", code="previous_response_in_progress")
    return entry.context()


def stored_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as OpenAI lists input items: each with an `id`, a message's content as parts."""
    items = []
    for item in body.items:
        stored = item.model_dump(exclude_none=True)
        stored.setdefault("id", new_id(_ID_PREFIX[item.type]))
        if isinstance(item, MessageItem):
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                stored["content"] = [{"type": kind, "text": item.content}]
        if not isinstance(item, ReasoningItem):
            stored.setdefault("status", "completed")
        items.append(stored)
    return items


class Keeper:
    """Keeps one response in the store as it goes: in progress from the start, then its end."""

    def __init__(self, request: Request, input_items: list[dict[str, Any]]) -> None:
        self.store = response_store(request)
        self.owner = request_owner(request)
        self.input_items = input_items
        self.ended = False

    def start(self, response: dict[str, Any]) -> None:
        self.store.put(StoredResponse(self.owner, response, self.input_items))

    def end(self, response: dict[str, Any]) -> None:
        self.ended = True
        self.store.update(response)


# ---- the routes ----------------------------------------------------------------------------------


def retrieve(request: Request, response_id: str) -> JSONResponse:
    if request.query_params.get("stream", "").lower() == "true":
        raise invalid_request("Streaming a stored response again is not supported: retrieve it without 'stream'",
                              param="stream", code="unsupported_parameter")
    entry = response_store(request).get(request_owner(request), response_id)
    if entry is None:
        raise not_found(response_id)
    return JSONResponse(entry.response)


def delete(request: Request, response_id: str) -> JSONResponse:
    if not response_store(request).delete(request_owner(request), response_id):
        raise not_found(response_id)
    logger.info("stored response %s deleted", response_id)
    return JSONResponse(deleted(response_id))


def input_items(request: Request, response_id: str) -> JSONResponse:
    """OpenAI's list: newest first unless `order=asc`, `limit` (1-100, 20 by default) items after the one `after`
    names."""
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("order must be 'asc' or 'desc'", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= _MAX_LIST:
        raise invalid_request(f"limit must be an integer from 1 to {_MAX_LIST}", param="limit")
    entry = response_store(request).get(request_owner(request), response_id)
    if entry is None:
        raise not_found(response_id)
    items = entry.input_items if order == "asc" else entry.input_items[::-1]
    after = query.get("after")
    if after is not None:
        position = next((index for index, item in enumerate(items) if item.get("id") == after), None)
        if position is None:
            raise invalid_request(f"No input item with id '{after}' in response '{response_id}'", param="after")
        items = items[position + 1:]
    page = items[:limit]
    return JSONResponse(item_list(page, has_more=len(items) > limit))


__all__ = ["Keeper", "delete", "input_items", "previous_context", "retrieve", "stored_items"]
