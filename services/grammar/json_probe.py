"""NameProbe: whether the grammar can go on without repeating a name, asked through the matcher,
with every answer kept by the grammar state it was asked in.

Where patternProperties or propertyNames limit the names an object admits, a token after which a
name is next (or that ends inside a name that could still become a used one) is legal only if
some continuation completes an unused name or leaves the used ones behind. The probe accepts the
token, walks single-byte tokens through the matcher depth-first (accept, then roll back) while
the text could still become a used name, and rolls back; the grammar guarantees a completion from
the first state that leaves the used names behind. Each step fills one mask and answers at once
when a byte the grammar takes leaves the used names behind (an open name language: the first
step); a finite one is searched to the end, one mask per byte of the used names it shares.

Answers are kept by a digest of the output read so far (`Key`): the matcher's state and the
companion's (its used names included) are functions of the bytes and control tokens it accepted,
so one digest names both, whichever tokens spelled the bytes. The JSON layout between tokens
(whitespace outside strings and names) is left out of the digest: the emitted grammars write it
as a rule of its own, which never changes the names that may follow. So the masks of one state
(the lookahead's K+1 masks, a proposer's probe then the verification), the tokens of one mask
that reach one state (`,` and `, `; `"a` and `"` then `a`) and the next position's probes along
the same names share one search.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

from services.grammar.json_index import WS_BYTES
from services.grammar.json_text import (
    AFTER,
    COLON,
    KEY0,
    KEYX,
    SCALAR,
    VALUE,
    VALUE0,
    Duplicate,
    near_used,
)
from shared.frontends.token_domain import TokenDomain

# Accepts one probe may try before it gives up and keeps the token (a name language with very
# many spellings of the used names; never reached by the schemas the corpus holds).
PROBE_BUDGET = 4096
_WS = frozenset(WS_BYTES)
# JSON reader modes whose whitespace is layout (outside strings and names)
LAYOUT = frozenset((VALUE, VALUE0, KEY0, KEYX, COLON, SCALAR, AFTER))
# Answers kept per request before the store starts over (each 16 bytes of digest and a bool).
CACHE_LIMIT = 1 << 16


class Key:
    """The running digest of what a companion read (see the module docstring): ordinary bytes as
    themselves (0xFF escaped), layout whitespace left out, a control token as 0xFF 0x01 and its
    id. Immutable: `extended` makes a new one."""

    __slots__ = ("_h",)

    def __init__(self, h=None) -> None:
        self._h = blake2b(digest_size=16) if h is None else h

    def extended(self, data: bytes) -> "Key":
        if not data:
            return self
        h = self._h.copy()
        h.update(data)
        return Key(h)

    def digest(self) -> bytes:
        return self._h.digest()


def significant(state: tuple, byte: int) -> bytes:
    """What `byte`, read in the companion state `state` ((where, json)), adds to the digest."""
    if byte in _WS and state[1][0] in LAYOUT:
        return b""
    return b"\xff\x00" if byte == 0xFF else bytes((byte,))


def control(token_id: int) -> bytes:
    """What a control token adds to the digest."""
    return b"\xff\x01" + token_id.to_bytes(4, "little")


class NameProbe:
    """The probes of one request's companion and their answers. `frame`: the companion's
    (json_spans.py), whose `step` reads one byte."""

    def __init__(self, frame, domain: TokenDomain) -> None:
        self.frame = frame
        self.domain = domain
        self.answers: dict[bytes, bool] = {}
        self.probes = 0  # searches run (the report's and the tests' view of the cost)
        self.hits = 0  # probes answered from `answers`
        self.gave_up = 0  # probes that ran out of PROBE_BUDGET (the token was kept)
        self._steps: ByteSteps | None = None  # made at the first probe

    def probe(self, matcher, token: int, after: tuple, key: Key) -> bool:
        """Whether, once `token` is accepted (the companion then in `after`, the output read so
        far digested as `key`), the grammar can go on without repeating a name. `matcher` is
        left as it was."""
        digest = key.digest()
        known = self.answers.get(digest)
        if known is not None:
            self.hits += 1
            return known
        self.probes += 1
        if not matcher.accept_token(token):
            return False
        budget = [PROBE_BUDGET]
        try:
            found = self._search(matcher, after, key, budget, digest)
        finally:
            matcher.rollback(1)
        if budget[0] <= 0:
            self.gave_up += 1
            return True
        return found

    def _keep(self, digest: bytes, found: bool, budget: list[int]) -> bool:
        # An answer is exact only when no search under it gave up (the budget only shrinks).
        if budget[0] > 0:
            if len(self.answers) >= CACHE_LIMIT:
                self.answers.clear()
            self.answers[digest] = found
        return found

    def _search(self, matcher, state: tuple, key: Key, budget: list[int],
                digest: bytes | None = None) -> bool:
        # Depth-first over single bytes the grammar accepts, while the text could still become a
        # used name; True at the first state that cannot (or once the budget is spent).
        if not near_used(state[1]) or budget[0] <= 0:
            return True
        if digest is None:  # a state reached by layout shares its parent's digest: no lookup
            digest = key.digest()
            known = self.answers.get(digest)
            if known is not None:
                return known
        if state[1][0] == KEYX:  # the quote, else the first whitespace the grammar takes
            for byte in b'"' + WS_BYTES:
                found = self._branch(matcher, state, key, byte, budget)
                if found is not None:
                    return self._keep(digest, found, budget)
            return self._keep(digest, False, budget)
        # Every byte the grammar takes next (one mask fill): one that leaves the used names
        # behind answers at once (the grammar completes from there); the others are searched.
        deeper = []
        for byte in self._legal_bytes(matcher, budget):
            try:
                child = self.frame.step(state, byte)
            except Duplicate:
                continue
            if not near_used(child[1]):
                return self._keep(digest, True, budget)
            deeper.append(byte)
        for byte in deeper:
            if self._branch(matcher, state, key, byte, budget):
                return self._keep(digest, True, budget)
            if budget[0] <= 0:
                return True
        return self._keep(digest, False, budget)

    def _branch(self, matcher, state: tuple, key: Key, byte: int,
                budget: list[int]) -> bool | None:
        # The search after one more byte; None when the grammar does not take it.
        t = self.domain.byte_token_ids[byte]
        budget[0] -= 1
        if t < 0 or not matcher.accept_token(t):
            return None
        try:
            extra = significant(state, byte)
            child = self.frame.step(state, byte)
            if not extra:  # layout: the same digest, searched again from here
                return self._search(matcher, child, key, budget, key.digest())
            return self._search(matcher, child, key.extended(extra), budget)
        except Duplicate:
            return False
        finally:
            matcher.rollback(1)

    def _legal_bytes(self, matcher, budget: list[int]) -> list[int]:
        if self._steps is None:
            self._steps = ByteSteps(self.domain)
        budget[0] -= 16
        return self._steps.legal(matcher)


class ByteSteps:
    """The step of a probe: the bytes whose single-byte token the grammar takes next, read from
    one mask fill into a scratch row of its own (one per probing companion)."""

    def __init__(self, domain: TokenDomain) -> None:
        self.scratch = np.zeros((1, domain.mask_words), dtype=np.int32)
        ids = np.array(domain.byte_token_ids, dtype=np.int64)
        self.bytes = np.flatnonzero(ids >= 0)
        self.ids = ids[self.bytes]

    def legal(self, matcher) -> list[int]:
        matcher.fill_mask(self.scratch, 0)
        words = self.scratch[0].view(np.uint32)
        legal = (words[self.ids >> 5] >> (self.ids & 31).astype(np.uint32)) & 1
        return self.bytes[legal.astype(bool)].tolist()


__all__ = ["CACHE_LIMIT", "ByteSteps", "PROBE_BUDGET", "Key", "NameProbe", "control", "significant"]
