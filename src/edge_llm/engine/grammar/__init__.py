"""Grammars and JSON schemas from requests, in one place: GBNF read and measured before llama.cpp sees it
(`gbnf`, `limits`), the one error (`errors`), the cache of compiled grammars (`compiled`), and the JSON-schema
number and integer ranges as grammar rules (`integer_range`, `number_range`). Pure Python; the converter that
calls llama-cpp-python's SchemaConverter is `engine/llama/schema_grammar.py`."""
