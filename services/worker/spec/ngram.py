"""N-gram copy proposer (prompt lookup): drafts copied from the request's own context.

For n from `max_n` down to `min_n`, the last n tokens of the context (prompt + committed output)
are looked up earlier in the same context; at the most recent earlier occurrence the proposer
copies the tokens that followed it, up to k. The first n that matches wins (longer suffix
matches predict better). No model, no state: a draft is a guess, never constrained; the target
verifies it (one-hot q, design document section 8).

Given the vocabulary's bytes and the target's tokenizer, the proposer first matches and copies
modulo JSON layout (layout.py: a compact JSON prompt copied into an indented answer), and falls
back to the exact token match.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from services.worker.spec.layout import layout_copy


@dataclass(frozen=True)
class NgramProposer:
    """`propose(context, k)`: up to k draft ids. `min_n`, `max_n`: suffix lengths tried, 1 <=
    min_n <= max_n (defaults 2 and 4). `window`: only the last `window` context tokens are
    searched (bounds the host cost per step; default 4096). `token_bytes` (each id's bytes) and
    `encode` (the target's tokenizer): copy modulo JSON layout first (None: exact tokens only)."""

    min_n: int = 2
    max_n: int = 4
    window: int = 4096
    token_bytes: Sequence[bytes] | None = None
    encode: Callable[[str], list[int]] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"NgramProposer: need 1 <= min_n <= max_n, got {self.min_n}, "
                             f"{self.max_n}")
        if self.window <= self.max_n:
            raise ValueError(f"NgramProposer.window must be > max_n, got {self.window}")

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """The drafts that follow the most recent earlier occurrence of the context's longest
        matching suffix (at most k, possibly fewer near the end of the context); [] when no
        suffix of min_n..max_n tokens occurs earlier or k <= 0."""
        if k <= 0 or len(context) <= self.min_n:
            return []
        if self.token_bytes is not None and self.encode is not None:
            table = self.token_bytes
            data = b"".join(table[t] for t in context[-self.window:])
            drafts = layout_copy(data, self.encode, k)
            if drafts:
                return drafts
        ctx = np.asarray(context[-self.window:], dtype=np.int64)  # [L]
        size = ctx.shape[0]
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)  # [L-n, n]
            hits = np.flatnonzero((windows == ctx[size - n:]).all(axis=1))  # starts < L - n
            if hits.size:
                start = int(hits[-1]) + n  # the token after the most recent earlier occurrence
                return ctx[start:start + k].tolist()
        return []
