"""A vocabulary's token texts for the grammar checks' unit tests, shaped like a real one (Qwen2.5's has runs of up
to 128 spaces, 96 dashes and 32 newlines, whole words with their leading space, single digits, JSON punctuation):
the ambiguity check follows only characters that go on in some token."""

from __future__ import annotations

from edge_llm.engine.grammar.gbnf.tokens import TokenTexts

_RUNS = [char * count for char, longest in ((" ", 128), ("-", 96), ("\n", 32), ("=", 64), ("\t", 16), ("a", 8))
         for count in range(1, longest + 1)]
_WORDS = ["the", " the", "value", " value", "name", "true", "false", "null", "def", " return", "ab", "abc",
          "aaaa", "abab", "hello", " world", "queen", "Kxe", "O-O"]
_PUNCTUATION = ['"', '":', '":"', '",', '"}', '},{', '},', '{"', '["', ',"', ', ', ',\n', ':', ' {', '[', ']',
                '{', '}', '(', ')', ',', '.', ';', '*', '/', '+', '\\', "\\n", '\\"', "    \n", "  \n"]
TOKENS = TokenTexts(_RUNS + _WORDS + _PUNCTUATION + [chr(code) for code in range(32, 127)] + list("0123456789éä中"))
