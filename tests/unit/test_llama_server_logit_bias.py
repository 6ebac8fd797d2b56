"""llama-server's logit_bias forms read as its server-schema.cpp reads them (protocol/llama_server.bias_entries)."""

from edge_llm.api.protocol.llama_server import bias_entries

INF = float("-inf")


def test_pairs_ids_texts_and_false_in_order() -> None:
    assert bias_entries([[15, 2], ["Hi", False], [7, -1.5]]) == [(15, 2.0), ("Hi", INF), (7, -1.5)]


def test_object_keys_are_ids_when_they_read_as_integers_else_text() -> None:
    assert bias_entries({"42": False, " Paris": 5, "-3": 1}) == [(42, INF), (" Paris", 5.0), (-3, 1.0)]


def test_entries_llama_server_skips_are_skipped() -> None:
    assert bias_entries([[1], [1, 2, 3], "x", [1, True], [2, "big"], [None, 1], [3, 1]]) == [(3, 1.0)]
    assert bias_entries({"a": True, "b": None}) == []
    assert bias_entries(None) == [] and bias_entries([]) == []
