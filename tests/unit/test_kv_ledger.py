"""The KV ledger (engine/scheduling/kv_ledger.py) against a model of llama.cpp's unified cache cell by cell: a
sequence holds one cell per position, `seq_cp` tags the source's cells with the destination too, and a cell is in
use while anybody holds it. Every count the ledger answers must equal the model's, after any series of ops."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from edge_llm.engine.scheduling.kv_ledger import KvLedger

SEQ_IDS = range(4)


class CellModel:
    """Each holder's cells, position by position (a cell is a unique number)."""

    def __init__(self) -> None:
        self.cells: dict[int, list[int]] = {}
        self.owned: dict[int, set[int]] = {}  # the cells each holder computed itself, and still may shrink
        self._next = itertools.count()

    def length(self, seq_id: int) -> int:
        return len(self.cells.get(seq_id, []))

    def grow(self, seq_id: int, n: int) -> None:
        new = [next(self._next) for _ in range(max(n, 0))]
        self.cells.setdefault(seq_id, []).extend(new)
        self.owned.setdefault(seq_id, set()).update(new)

    def shrinkable(self, seq_id: int) -> int:
        """How many last positions `seq_id` computed itself and nobody else holds."""
        held = self.cells.get(seq_id, [])
        others = {cell for holder, cells in self.cells.items() if holder != seq_id for cell in cells}
        count = 0
        for cell in reversed(held):
            if cell not in self.owned.get(seq_id, set()) or cell in others:
                break
            count += 1
        return count

    def shrink(self, seq_id: int, n: int) -> None:
        if n > 0:
            del self.cells[seq_id][-n:]

    def copy(self, src: int, dst: int, length: int) -> None:
        self.cells[dst] = list(self.cells.get(src, [])[:length])
        self.owned[dst] = set()

    def drop(self, seq_id: int) -> None:
        self.cells.pop(seq_id, None)
        self.owned.pop(seq_id, None)

    def truncate(self, seq_id: int, length: int) -> None:
        self.cells[seq_id] = self.cells.get(seq_id, [])[:length]
        self.owned[seq_id] = set()  # what it grows next is new; what it keeps is no longer its to shrink

    def used(self, without: set[int] = frozenset(), truncated: dict[int, int] | None = None) -> int:
        limits = truncated or {}
        return len({cell for holder, cells in self.cells.items() if holder not in without
                    for cell in cells[:limits.get(holder, len(cells))]})

    def other_holders_from(self, seq_id: int, position: int) -> set[int]:
        mine = set(self.cells.get(seq_id, [])[position:])
        return {holder for holder, cells in self.cells.items() if holder != seq_id and mine & set(cells)}


def check(ledger: KvLedger, model: CellModel, data: st.DataObject) -> None:
    assert ledger.used == model.used()
    for seq_id in SEQ_IDS:
        assert ledger.length(seq_id) == model.length(seq_id)
        position = data.draw(st.integers(0, model.length(seq_id) + 1), label="from")
        assert ledger.other_holders_from(seq_id, position) == model.other_holders_from(seq_id, position)
    without = data.draw(st.sets(st.sampled_from(SEQ_IDS)), label="without")
    truncated = data.draw(st.dictionaries(st.sampled_from(SEQ_IDS), st.integers(0, 12), max_size=2), label="cut")
    assert ledger.used_without(without, truncated) == model.used(without, truncated)
    assert ledger.used_without(without) == model.used(without)


# No shrinking: a failing series is at most 10 ops as drawn, and shrinking one takes minutes (mutation runs fail many).
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(st.data())
def test_the_ledger_counts_the_cells_llama_cpps_cache_holds(data: st.DataObject) -> None:
    ledger, model = KvLedger(), CellModel()
    for _ in range(data.draw(st.integers(1, 10), label="ops")):
        op = data.draw(st.sampled_from(["grow", "grow", "shrink", "copy", "drop", "truncate"]), label="op")
        seq_id = data.draw(st.sampled_from(SEQ_IDS), label="seq")
        if op == "grow":
            n = data.draw(st.integers(-1, 6), label="n")
            ledger.grow(seq_id, n)
            model.grow(seq_id, n)
        elif op == "shrink":
            n = data.draw(st.integers(-1, model.shrinkable(seq_id)), label="n")
            ledger.shrink(seq_id, n)
            model.shrink(seq_id, n)
        elif op == "copy":
            src = data.draw(st.sampled_from(SEQ_IDS), label="src")
            if src == seq_id or model.length(seq_id):
                continue
            length = data.draw(st.integers(0, model.length(src)), label="length")
            ledger.copy(src, seq_id, length)
            model.copy(src, seq_id, length)
        elif op == "drop":
            ledger.drop(seq_id)
            model.drop(seq_id)
        else:
            length = data.draw(st.integers(0, model.length(seq_id) + 1), label="length")
            ledger.truncate(seq_id, length)
            model.truncate(seq_id, length)
        check(ledger, model, data)


def test_a_copy_shares_the_prefix_and_each_holder_grows_its_own_cells() -> None:
    ledger = KvLedger()
    ledger.grow(0, 10)
    ledger.copy(0, 1, 4)
    assert (ledger.used, ledger.length(1)) == (10, 4)
    ledger.grow(1, 3)  # 1's own cells: positions 4..6, beside 0's
    ledger.grow(0, 2)  # 0 still grows its own block
    assert (ledger.used, ledger.length(0), ledger.length(1)) == (15, 12, 7)
    assert ledger.other_holders_from(0, 0) == {1} and ledger.other_holders_from(0, 4) == set()
    assert ledger.used_without({0}) == 7 and ledger.used_without({1}) == 12
    assert ledger.used_without(set(), {0: 2}) == 2 + 2 + 3  # 0 keeps 2: 1 still holds the shared 4


def test_shrink_gives_back_only_the_rejected_cells() -> None:
    ledger = KvLedger()
    ledger.grow(0, 5)
    ledger.shrink(0, 2)
    assert (ledger.used, ledger.length(0)) == (3, 3)
    ledger.shrink(0, 3)  # everything it computed: it holds nothing
    assert (ledger.used, ledger.length(0)) == (0, 0)
    ledger.grow(0, 1)
    assert (ledger.used, ledger.length(0)) == (1, 1)
    ledger.copy(0, 1, 1)
    ledger.grow(1, 2)
    with pytest.raises(AssertionError, match="^seq 1 shrinks by 3 cells it did not compute$"):
        ledger.shrink(1, 3)
    with pytest.raises(AssertionError, match="^shrinks cells others hold$"):
        ledger.shrink(0, 1)


def test_a_holder_shrunk_to_nothing_holds_nothing_and_may_shrink_to_what_others_hold() -> None:
    ledger = KvLedger()
    ledger.grow(0, 3)
    ledger.shrink(0, 3)
    ledger.grow(1, 2)
    ledger.copy(1, 0, 2)  # 0 holds nothing again: it may take a copy
    assert (ledger.used, ledger.length(0)) == (2, 2)
    ledger.grow(2, 5)
    ledger.copy(2, 3, 3)
    ledger.shrink(2, 2)  # down to exactly what 3 holds of it
    assert (ledger.used, ledger.length(2)) == (2 + 3, 3)


def test_a_copy_needs_an_empty_destination_and_enough_source() -> None:
    ledger = KvLedger()
    ledger.grow(0, 3)
    ledger.grow(1, 1)
    with pytest.raises(AssertionError, match="^copy into seq 1, which holds cells$"):
        ledger.copy(0, 1, 2)
    with pytest.raises(AssertionError, match="^copy of 4 positions from seq 0 holding 3$"):
        ledger.copy(0, 2, 4)


def test_a_copy_let_go_of_leaves_the_source_its_own_cells_to_grow_and_shrink() -> None:
    ledger = KvLedger()
    ledger.grow(0, 5)
    ledger.copy(0, 1, 5)
    ledger.truncate(1, 0)  # the follower lets go of all it took
    ledger.grow(0, 1)
    ledger.shrink(0, 3)  # cells 0 computed and nobody else holds, across its two growths
    assert (ledger.used, ledger.length(0), ledger.length(1)) == (3, 3, 0)


def counted(ledger: KvLedger) -> int:
    """The cells in use counted again from the blocks (the ledger's `used` is kept by increments on a grow)."""
    return ledger.used_without(set())


def test_a_reused_id_never_grows_a_block_it_let_go_of() -> None:
    dropped = KvLedger()
    dropped.grow(1, 10)
    dropped.copy(1, 2, 4)
    dropped.drop(1)  # id 1 is free again; 2 still holds 4 cells of its block
    dropped.copy(2, 1, 1)
    dropped.grow(1, 1)  # the new holder of id 1 computes its own cell
    assert dropped.used == counted(dropped) == 4 + 1 and dropped.length(1) == 2

    cut = KvLedger()
    cut.grow(1, 5)
    cut.copy(1, 2, 5)
    cut.truncate(1, 3)  # its block is cut: what it grows next is new
    cut.grow(1, 2)
    assert cut.used == counted(cut) == 5 + 2

    let_go = KvLedger()
    let_go.grow(0, 2)
    let_go.copy(0, 1, 2)
    let_go.grow(1, 4)  # 1's own block: positions 2..5
    let_go.copy(1, 2, 6)
    let_go.truncate(1, 2)  # lets go of its own block (it starts at the new length)
    let_go.truncate(1, 0)
    let_go.copy(2, 1, 4)
    let_go.grow(1, 1)
    assert let_go.used == counted(let_go) == 6 + 1


def test_truncating_to_its_length_changes_nothing() -> None:
    ledger = KvLedger()
    ledger.grow(0, 5)
    ledger.truncate(0, 5)
    ledger.grow(0, 1)
    ledger.shrink(0, 3)  # still one block of its own
    assert (ledger.used, ledger.length(0)) == (3, 3)


def test_other_holders_are_those_of_the_cells_from_the_position() -> None:
    ledger = KvLedger()
    ledger.grow(0, 5)
    ledger.copy(0, 1, 3)
    assert ledger.other_holders_from(1, 3) == set()  # 0 holds more of that block, but not 1's cells
    assert ledger.other_holders_from(1, 2) == {0}
    ledger.grow(1, 3)
    ledger.copy(1, 2, 6)
    assert ledger.other_holders_from(1, 3) == {2}  # in 1's own block, after the one it shares with 0
    ledger.truncate(1, 4)  # cut: its own block's end goes
    ledger.grow(1, 2)
    ledger.copy(1, 3, 6)
    ledger.truncate(1, 1)  # lets go of both blocks that start after position 1
    assert ledger.other_holders_from(3, 5) == set() and ledger.other_holders_from(3, 4) == set()
    assert ledger.other_holders_from(3, 3) == {2}


def test_growing_or_copying_nothing_holds_nothing() -> None:
    ledger = KvLedger()
    ledger.grow(0, 3)
    ledger.grow(1, 0)
    ledger.copy(0, 2, 0)
    assert (ledger.used, ledger.length(1), ledger.length(2)) == (3, 0, 0)
    ledger.copy(0, 1, 2)  # both still hold nothing: each may take a copy
    ledger.copy(0, 2, 3)
    assert (ledger.used, ledger.length(1), ledger.length(2)) == (3, 2, 3)


def test_a_copy_of_the_first_of_several_blocks() -> None:
    ledger = KvLedger()
    ledger.grow(0, 2)
    ledger.copy(0, 1, 2)
    ledger.grow(1, 3)  # 1 holds 0's block, then its own
    ledger.copy(1, 2, 2)  # only the first
    assert (ledger.used, ledger.length(2)) == (5, 2)
    assert ledger.other_holders_from(0, 0) == {1, 2}
