"""Prompts that start alike share their KV cells: a sequence admitted while a running one has computed, or is still
prefilling, the same first tokens follows it (its `leader`) and copies those positions (a `KvCopy`: shared cells)
once the leader has them, instead of computing them twice. Pure, no llama.cpp."""

from __future__ import annotations

from edge_llm.engine.scheduling.kv_book import KvBook
from edge_llm.engine.scheduling.sequence import Sequence
from edge_llm.engine.scheduling.token_match import common_prefix_length

MIN_SHARED_PREFIX = 8  # shorter common prefixes with running sequences are not worth waiting for


class PrefixSharing:
    def __init__(self, kv: KvBook, running: list[Sequence], max_preemptions: int) -> None:
        self._kv = kv
        self._running = running  # the scheduler's list, read only
        self._max_preemptions = max_preemptions

    def best_leader(self, head: Sequence) -> tuple[Sequence, int] | None:
        """The running sequence sharing the longest prefix with `head`'s feed (at least MIN_SHARED_PREFIX), and its
        length."""
        if head.pinned(self._max_preemptions) or not head.use_cache:
            return None  # a pinned one's room is counted without the leader's cells, which a preemption could take
        best: tuple[Sequence, int] | None = None
        prompt = head.feed
        for sequence in self._running:
            length = min(common_prefix_length(sequence.known_tokens(), prompt), len(prompt) - 1)
            if length >= MIN_SHARED_PREFIX and (best is None or length > best[1]):
                best = (sequence, length)
        return best

    def follow(self, follower: Sequence, leader: Sequence, shared: int) -> None:
        follower.leader, follower.shared = leader, shared
        if leader.n_past >= shared:
            self.copy_from_leader(follower)

    def copy_ready_prefixes(self) -> None:
        """Followers whose leader has now computed their shared prefix take it."""
        for sequence in self._running:
            if sequence.leader is not None and sequence.leader.n_past >= sequence.shared:
                self.copy_from_leader(sequence)

    def copy_from_leader(self, follower: Sequence) -> None:
        leader, length = follower.leader, follower.shared
        assert leader is not None
        self._kv.share_prefix(leader.seq_id, follower, length)
        follower.leader = None

    def release_followers(self, leader: Sequence) -> None:
        """A leader leaves: followers take what it has computed, or prefill by themselves."""
        for sequence in self._running:
            if sequence.leader is leader:
                if leader.n_past >= sequence.shared:
                    self.copy_from_leader(sequence)
                else:
                    sequence.leader = None
