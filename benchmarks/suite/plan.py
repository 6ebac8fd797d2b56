"""What one benchmark run does: the settings every part shares, and how much of everything (`Plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"

THREADS = 2
CLIENT_LEVELS = (1, 4, 8)
RAW_BATCHES = (1, 4, 8)
NEW_TOKENS = 64
SERVER_PARALLEL = 8
RAW_PROMPT = ("You are a helpful coding assistant. Answer the question with working code.\n"
              "Question: write a Python function that returns the n-th Fibonacci number.\nAnswer:")
PREFIX_QUESTIONS = (
    "Which rule is about naming?",
    "Summarize rule 3 in one sentence.",
    "How many rules mention tests?",
    "What does the guide say about logging?",
    "Which rule covers error handling?",
    "Give one rule about documentation.",
    "What is the first rule?",
    "Name a rule about performance.",
)
DISTURBED = 0.15  # a figure measured while other processes used more of the CPUs is not to be trusted


@dataclass(frozen=True)
class Plan:
    """How much of everything one run does."""

    quick: bool
    raw_repeats: int
    rounds_per_client: int
    min_requests: int
    warmup: int
    prefix_requests: int
    level_repeats: int = 3  # our levels, each between two raw measurements (a paired design)
    quiet_wait_s: float = 120.0
    attempts: int = 3  # a measurement disturbed by other processes is taken again, at most this often
    prefix_max_tokens: int = 8

    @classmethod
    def make(cls, quick: bool, quiet_wait_s: float) -> Plan:
        if quick:
            return cls(quick=True, raw_repeats=1, rounds_per_client=2, min_requests=4, warmup=1, prefix_requests=4,
                       level_repeats=1,
                       quiet_wait_s=quiet_wait_s, attempts=2)
        return cls(quick=False, raw_repeats=2, rounds_per_client=4, min_requests=8, warmup=2, prefix_requests=6,
                   quiet_wait_s=quiet_wait_s)

    def requests_for(self, clients: int) -> int:
        return max(self.min_requests, self.rounds_per_client * clients)
