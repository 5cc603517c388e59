"""NamedMatcher: one session's grammar matcher together with its companions, which share every
matcher transaction: the name companions (the XML tool grammar's ParameterNameConstraint for the
argument names of a call; the JsonNameConstraint for the member names of each object of JSON
content, of Hermes call arguments and of JSON-valued XML parameters), a length companion (the
XML tool grammar's RawLengthConstraint for raw string values, or the JsonLengthConstraint of
JSON content for the strings its grammar writes unbounded) and the UniqueItemsConstraint of JSON
content for arrays whose uniqueItems the grammar leaves to it.

Each companion clears, in each mask the matcher fills, the tokens the grammar alone cannot refuse
(a repeated name, and for JSON those after which only used names could follow: it probes the
matcher, leaving it as it was; a string that can no longer keep its length bounds), and
follows every token and byte the matcher accepts and every rollback. Keeping them in one object
is what makes that hold everywhere: the session's lookahead and previews (session.py) and a
proposer's probe (probe.py) call only this object. Without companions it is the matcher alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from services.grammar.client import (
    JsonLengthConstraint,
    JsonNameConstraint,
    Matcher,
    ParameterNameConstraint,
    RawLengthConstraint,
    UniqueItemsConstraint,
)
from services.worker.output.positions import PositionState
from services.worker.output.report import ConstraintCounters
from shared.errors import InternalError


@dataclass
class Walk:
    """What `NamedMatcher.walk` did: the position states, the drafts it accepted (to roll back),
    where it stopped and why, and the exception a failing engine raised (None: it did not)."""

    states: list[PositionState]
    accepted: int = 0
    illegal_at: int | None = None
    eos_at: int | None = None
    dead_at: int | None = None
    error: Exception | None = None


# A name companion: accept(token), accept_bytes(data), rollback(n), apply(row, matcher).
NameCompanion = Union[ParameterNameConstraint, JsonNameConstraint]
# A length companion: accept(token) -> bool, rollback(n), apply(row).
LengthCompanion = Union[RawLengthConstraint, JsonLengthConstraint]


class NamedMatcher:
    """`matcher`, `names` (a name companion, several in the order they clear masks, or None),
    `lengths` and `items` (None: no such companion), moving together."""

    def __init__(self, matcher: Matcher,
                 names: NameCompanion | Sequence[NameCompanion] | None = None,
                 lengths: LengthCompanion | None = None,
                 items: UniqueItemsConstraint | None = None) -> None:
        self.matcher = matcher
        self.names: tuple[NameCompanion, ...] = () if names is None else \
            tuple(n for n in names if n is not None) if isinstance(names, (tuple, list)) \
            else (names,)
        self.lengths = lengths
        self.items = items
        if not self.names and lengths is None and items is None:
            # the matcher alone: its own methods, without a layer per token (the commit path
            # accepts one token per row and step)
            self.accept_token = matcher.accept_token  # type: ignore[method-assign]
            self.is_terminated = matcher.is_terminated  # type: ignore[method-assign]

    def accept_token(self, token: int) -> bool:
        """Accept `token`; False (nothing changes) when the grammar or the length companion
        refuses it."""
        if not self.matcher.accept_token(token):
            return False
        if self.lengths is not None and not self.lengths.accept(token):
            self.matcher.rollback(1)
            return False
        for names in self.names:
            names.accept(token)
        if self.items is not None:
            self.items.accept(token)
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Accept raw bytes (a continuation prefix; not undoable by rollback); the companions
        follow them. False (nothing changes) when the grammar or the JSON length companion
        refuses them."""
        counted = self.lengths if isinstance(self.lengths, JsonLengthConstraint) else None
        if counted is not None and counted.after_bytes(data) is None:
            return False
        if not self.matcher.accept_bytes(data):
            return False
        if counted is not None:
            counted.accept_bytes(data)
        for names in self.names:
            names.accept_bytes(data)
        if self.items is not None:
            self.items.accept_bytes(data)
        return True

    def rollback(self, n: int) -> None:
        self.matcher.rollback(n)
        for names in self.names:
            names.rollback(n)
        if self.lengths is not None:
            self.lengths.rollback(n)
        if self.items is not None:
            self.items.rollback(n)

    def apply_names(self, row: torch.Tensor) -> None:
        """Clear in `row` ([ceil(V/32)] int32, the matcher's mask at its current state) the tokens
        the companions refuse: those that would repeat a name or leave a string's length
        bounds."""
        if self.lengths is not None:
            self.lengths.apply(row)
        for names in self.names:
            names.apply(row, self.matcher)
        if self.items is not None:
            self.items.apply(row, self.matcher)

    def fill_mask(self, out: torch.Tensor, i: int) -> None:
        """Fill `out[i]` with the legal set, the companion's repeats cleared."""
        self.matcher.fill_mask(out, i)  # bits past the domain are zero (engine contract)
        self.apply_names(out[i])

    def forced_bytes(self) -> bytes:
        return self.matcher.forced_bytes()

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def is_completed(self) -> bool:
        return self.matcher.is_completed()

    def walk(self, drafts: Sequence[int], out: torch.Tensor, size: int, filler: torch.Tensor,
             counters: ConstraintCounters) -> Walk:
        """Fill `out[i]` with the mask after the committed output + drafts[:i], accepting the
        drafts as it goes, for i = 0..len(drafts): it stops at a dead end (its row becomes
        `filler`), an illegal draft or an accepted EOS, and fills the rows after the stop with
        `filler`; `size`: the token domain's. The accepted drafts stay accepted (the caller rolls
        them back). A matcher that raises, or refuses a draft its own mask allowed, ends the walk
        with `error` set. `counters.mask_positions` counts the masks filled."""
        n = len(drafts)
        w = Walk([PositionState.UNREACHABLE] * (n + 1))
        try:
            for i in range(n + 1):
                # out[i]: [ceil(V/32)] int32, the legal set after committed + drafts[:i]
                self.fill_mask(out, i)
                counters.mask_positions += 1
                if not bool(out[i].any()):
                    w.states[i] = PositionState.DEAD_END
                    out[i].copy_(filler)
                    w.dead_at = i
                    break
                w.states[i] = PositionState.READY
                if i == n:  # the bonus mask
                    break
                draft = int(drafts[i])
                if not (0 <= draft < size) or not (int(out[i, draft >> 5]) >> (draft & 31)) & 1:
                    w.illegal_at = i
                    break
                if not self.accept_token(draft):
                    raise InternalError(f"the matcher refused draft {draft} that its mask allowed")
                w.accepted += 1
                if self.is_terminated():
                    w.eos_at = i
                    break
            if i < n:  # positions after the stop are Unreachable
                out[i + 1:n + 1].copy_(filler.expand(n - i, -1))
        except Exception as exc:  # the engine failed on this row's state: only its row fails
            w.error = exc
        return w
