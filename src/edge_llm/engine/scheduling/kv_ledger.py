"""How many KV cells are in use when sequences share prefixes: pure bookkeeping, no llama.cpp.

llama.cpp's unified KV cache shares cells on `seq_cp` (the cells of positions [0, n) of the source are
tagged with the destination too) and frees a cell when the last sequence holding it is removed. The
ledger mirrors that with blocks: a block is the run of cells one holder computed itself, from the
position it started at. A copy of positions [0, n) references the source's blocks up to n, so every
reference to a block covers a prefix of it, and a block uses as many cells as its longest reference.
Shared prefix cells are thus counted once, however many cache entries, followers and running
sequences hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class _Block:
    owner: int
    start: int
    ends: dict[int, int] = field(default_factory=dict)  # holder seq id → end (exclusive) of its reference


class KvLedger:
    def __init__(self) -> None:
        self._holdings: dict[int, list[_Block]] = {}
        self.used = 0  # distinct cells held by anyone; an int, so other threads may read it at any time

    def length(self, seq_id: int) -> int:
        """Positions [0, length) that `seq_id` holds."""
        blocks = self._holdings.get(seq_id)
        return blocks[-1].ends[seq_id] if blocks else 0

    def grow(self, seq_id: int, n: int) -> None:
        """`seq_id` computed `n` new positions after those it holds."""
        if n <= 0:
            return
        blocks = self._holdings.setdefault(seq_id, [])
        if blocks and blocks[-1].owner == seq_id:
            blocks[-1].ends[seq_id] += n
        else:
            start = self.length(seq_id)
            blocks.append(_Block(seq_id, start, {seq_id: start + n}))
        # Once per decode token and sequence, so no recount: the owner's reference is its block's longest
        # (copies took prefixes of it), so the block, and the cells in use, grow by exactly n.
        self.used += n

    def shrink(self, seq_id: int, n: int) -> None:
        """`seq_id` lets go of its last `n` positions, which it computed itself and nobody else holds (a rejected
        draft's cells, in the step that computed them)."""
        if n <= 0:
            return
        block = self._holdings[seq_id][-1]
        end = block.ends[seq_id] - n
        assert block.owner == seq_id and end >= block.start, f"seq {seq_id} shrinks by {n} cells it did not compute"
        assert all(e <= end for holder, e in block.ends.items() if holder != seq_id), "shrinks cells others hold"
        block.ends[seq_id] = end
        if end == block.start and len(block.ends) == 1:
            self._holdings[seq_id].pop()
        self.used -= n

    def copy(self, src: int, dst: int, length: int) -> None:
        """`dst` (holding nothing) takes the cells of positions [0, length) of `src`."""
        assert not self._holdings.get(dst), f"copy into seq {dst}, which holds cells"
        assert self.length(src) >= length, f"copy of {length} positions from seq {src} holding {self.length(src)}"
        taken: list[_Block] = []
        for block in self._holdings.get(src, []):
            if block.start >= length:
                break
            block.ends[dst] = min(block.ends[src], length)
            taken.append(block)
        if taken:
            self._holdings[dst] = taken
        self._recount()

    def drop(self, seq_id: int) -> None:
        """`seq_id` lets go of all its cells; cells nobody else holds are free again."""
        for block in self._holdings.pop(seq_id, []):
            del block.ends[seq_id]
            if block.owner == seq_id:
                block.owner = -1  # seq ids are reused: a later holder of this id must not grow this block
        self._recount()

    def truncate(self, seq_id: int, length: int) -> None:
        """`seq_id` keeps only positions [0, length) of what it holds (what it grows next is a new block)."""
        kept: list[_Block] = []
        for block in self._holdings.get(seq_id, []):
            if block.start >= length:
                del block.ends[seq_id]
                if block.owner == seq_id:
                    block.owner = -1
                continue
            if block.ends[seq_id] > length:
                block.ends[seq_id] = length
                if block.owner == seq_id:
                    block.owner = -1
            kept.append(block)
        self._holdings[seq_id] = kept
        self._recount()

    def other_holders_from(self, seq_id: int, position: int) -> set[int]:
        """The other sequences holding any of `seq_id`'s cells at positions >= `position`."""
        others: set[int] = set()
        for block in self._holdings.get(seq_id, []):
            if block.ends[seq_id] <= position:
                continue
            others.update(holder for holder, end in block.ends.items()
                          if holder != seq_id and end > max(position, block.start))
        return others

    def used_without(self, seq_ids: set[int], truncated: dict[int, int] | None = None) -> int:
        """The cells in use if the holders `seq_ids` dropped theirs (and each holder in `truncated` kept only the
        positions below its length there)."""
        return self._count(exclude=seq_ids, truncated=truncated or {})

    def _count(self, exclude: set[int] | frozenset[int] = frozenset(), truncated: dict[int, int] | None = None) -> int:
        limits = truncated or {}
        seen: set[int] = set()
        total = 0
        for seq_id, blocks in self._holdings.items():
            if seq_id in exclude:
                continue
            for block in blocks:
                if id(block) in seen:
                    continue
                seen.add(id(block))
                ends = [min(end, limits.get(holder, end)) for holder, end in block.ends.items()
                        if holder not in exclude]
                total += max(0, max(ends, default=block.start) - block.start)
        return total

    def _recount(self) -> None:
        self.used = self._count()
