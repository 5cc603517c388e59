"""The oracle drafter of the benchmarks and tests (wrapped in the worker's ContextProposer by
bench/spec.py and the tests): it proposes the target's own continuation,
recorded in a first pass (a greedy run without speculation), so a round accepts every draft and
measures the machinery alone (verification forward, K+1 masks, acceptance, commit). It never
serves real requests: `infernix serve` has no flag for it.
"""

from __future__ import annotations

from collections.abc import Sequence


class OracleProposer:
    """`propose(context, k)`: the k tokens that followed `context` in a recorded sequence.

    `record(sequence)` stores one full token sequence (prompt + output); a context that is a
    prefix of a recorded sequence gets its next tokens, any other context gets no draft."""

    def __init__(self) -> None:
        self._sequences: list[tuple[int, ...]] = []  # a few per benchmark: a scan is enough

    def record(self, sequence: Sequence[int]) -> None:
        self._sequences.append(tuple(int(t) for t in sequence))

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        n = len(context)
        ctx = tuple(context)
        for seq in self._sequences:
            if len(seq) > n and seq[:n] == ctx:
                return list(seq[n:n + k])
        return []
