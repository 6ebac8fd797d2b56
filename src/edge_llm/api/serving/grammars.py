"""One model's response grammars, shared by every endpoint family of that model (serving/core.py): a JSON schema
compiled to checked GBNF once (a bounded cache keyed by the schema's JSON text), GBNF checked against the limits,
and llama-server's `grammar` / `json_schema` fields. Everything here blocks: it runs in the tokenizer thread (or the
bulk thread), through `Serving.off_loop`.

A schema asked for through chat's `response_format`, Anthropic's `output_config.format`, Responses' `text.format`,
Ollama's `format` or llama-server's `json_schema` is the same schema: it compiles once, whichever family sees it
first (the log line "compiled a JSON schema into a grammar" is written once per compilation).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from edge_llm.api.errors import invalid_request
from edge_llm.api.protocol.llama_server import LlamaServerFields
from edge_llm.engine.facade import EngineClient, GrammarError

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 64  # distinct schemas kept compiled per model


class Grammars:
    def __init__(self, engine: EngineClient, size: int = GRAMMAR_CACHE_SIZE) -> None:
        self.engine = engine
        self.size = size
        self._compiled: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()  # the tokenizer and the bulk thread may both compile

    def schema(self, schema: dict[str, Any], *, param: str) -> str:
        """`schema` as checked GBNF, compiled once; a schema the limits refuse is a 400 naming `param`."""
        key = json.dumps(schema)  # not sort_keys: the grammar writes an object's properties in the schema's order
        with self._lock:
            gbnf = self._compiled.get(key)
            if gbnf is not None:
                self._compiled.move_to_end(key)
                return gbnf
        gbnf = self.checked(self.to_gbnf(schema, param=param), param=param)
        logger.info("compiled a JSON schema into a grammar", extra={
            "schema_sha256": hashlib.sha256(key.encode()).hexdigest()[:16], "grammar_bytes": len(gbnf)})
        with self._lock:
            self._compiled[key] = gbnf
            while len(self._compiled) > self.size:
                self._compiled.popitem(last=False)
        return gbnf

    def to_gbnf(self, schema: dict[str, Any], *, param: str) -> str:
        """A JSON schema as GBNF, not checked nor kept (a part of a larger grammar: a forced tool call's)."""
        try:
            return self.engine.json_schema_to_grammar(schema)
        except GrammarError as exc:
            raise invalid_request(str(exc), param=param, code="invalid_schema") from None

    def checked(self, grammar: str, *, param: str) -> str:
        """`grammar` after the limits and a compilation with the model's vocabulary; else a 400 naming `param`."""
        try:
            self.engine.check_grammar(grammar)
        except GrammarError as exc:
            raise invalid_request(f"{exc}", param=param, code="invalid_schema") from None
        return grammar

    def native(self, body: LlamaServerFields) -> str | None:
        """llama-server's `grammar` (GBNF) or `json_schema`, checked as response grammars are."""
        if body.grammar is not None and body.json_schema is not None:
            raise invalid_request("give grammar or json_schema, not both", param="grammar")
        if body.grammar is not None:
            return self.checked(body.grammar, param="grammar")
        if body.json_schema is not None:
            return self.schema(body.json_schema, param="json_schema")
        return None
