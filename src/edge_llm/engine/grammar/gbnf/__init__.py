"""GBNF grammars from requests: read as llama.cpp reads them (`syntax`) and measured before they run (`bounds`)."""
