"""Mask positions: the per-position descriptor states, the filler row of non-Ready positions and
the result of one lookahead (design document: "Ready, DeadEnd, Unreachable").

Mask rows: bit i of int32 word w is token 32w+i; bits past the domain size are zero. Positions that
are not Ready get the filler row: every id of the domain allowed, so a kernel that precomputes such
a column always finds a finite candidate; what it samples there never enters the accepted prefix,
because the Program reads the position state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import torch

from shared.errors import ConstraintDeadEnd, InfernixError


class PositionState(IntEnum):
    """Per-position mask descriptor; the values are what the Program stores in its int8 buffer."""

    DISABLED = 0  # unconstrained row: no mask, the existing sampling route
    READY = 1  # the prefix is legal and the row holds its legal mask
    DEAD_END = 2  # this hypothetical prefix has no legal next token; filler row
    UNREACHABLE = 3  # an earlier draft was illegal or EOS was accepted; filler row


@lru_cache(maxsize=8)
def tail_word(size: int) -> int:
    # The last word's valid bits as a signed int32 (bits past `size` zero).
    bits = size - 32 * ((size - 1) // 32)
    return int32((1 << bits) - 1)


@lru_cache(maxsize=8)
def filler(size: int) -> torch.Tensor:
    row = torch.full(((size + 31) // 32,), -1, dtype=torch.int32)  # [ceil(V/32)]
    row[-1] = tail_word(size)
    return row


def filler_row(size: int) -> torch.Tensor:
    """The safe filler of non-Ready positions: all ids below `size` allowed, bits past it zero.
    Returns a fresh `[ceil(size/32)]` int32 tensor."""
    return filler(size).clone()


@dataclass(frozen=True)
class LookaheadResult:
    """Position states of one lookahead; position i is the prefix committed + drafts[:i]."""

    states: tuple[PositionState, ...]  # len(drafts) + 1 entries
    base_position: int  # committed output tokens before position 0
    illegal_at: int | None = None  # index of the first illegal draft (its position is Ready)
    eos_at: int | None = None  # index of a draft EOS the matcher accepted
    dead_end_at: int | None = None  # the DeadEnd position, if any
    failure: InfernixError | None = None  # the matcher failed: position 0 is a DeadEnd with it

    @property
    def ready(self) -> int:
        """Leading Ready positions: the extent of valid mask rows."""
        n = 0
        while n < len(self.states) and self.states[n] is PositionState.READY:
            n += 1
        return n

    def states_tensor(self) -> torch.Tensor:
        """`[len(drafts)+1]` int8 tensor of the PositionState values."""
        return torch.tensor([int(s) for s in self.states], dtype=torch.int8)

    def dead_end_error(self) -> InfernixError | None:
        """The error that fails this request if verification reaches the DeadEnd position (the
        matcher's own failure, which fails it at position 0)."""
        if self.failure is not None:
            return self.failure
        if self.dead_end_at is None:
            return None
        position = self.base_position + self.dead_end_at
        return ConstraintDeadEnd(
            f"the constraint allows no token at output position {position}", position=position
        )


def int32(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word
