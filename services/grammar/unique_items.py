"""UniqueItemsConstraint: arrays with uniqueItems over an infinite (or large) scalar item domain
never repeat an item, with exact masks.

A context-free grammar cannot exclude the items an array used earlier, so the schema emits such
an array as a plain one (schema/unique_items.py says which, and refuses the shapes this cannot
keep exact) and this companion shares every transaction of the session's matcher, like the JSON
name companion (services/worker/output/named_matcher.py): it follows the text (one state per
accepted token, so a rollback of n tokens drops n states) and, in each mask the matcher fills,
clears

1. every token whose bytes complete an item JSON-equal to an earlier item of its array (strings
   compared after unescaping, as Python's json reads them; numbers by value, `1` and `1.0` alike;
   `true` is not `1`), and
2. every token after which the open item (or the item that must follow) can only become a used
   one. A state is settled, with a fresh completion guaranteed by the grammar, when the item's
   text so far is a prefix of no used item's spelling (string contents compared unescaped; a
   string part that is any string never dead-ends; an item still to come has fresh values while
   fewer are used than the domain's proved count); otherwise the grammar is probed: a walk over
   single-byte tokens through the matcher (accepted, then rolled back) looks for a settled
   state, exhaustively over the used items' spellings (finite), `PROBE_BUDGET` bytes at most
   (unique_probe.py). Where the domain's facts decide it, no probe runs: a finite domain's
   values, or a count of the bounded-length strings or range integers sharing the open text
   (`unique_probe.counted`).

Cost: only the tokens that can complete an item or leave an unsettled state are read
(unique_scan.py); probe answers are kept by a digest of the output read so far, and each state's
decisions by the same digest, so a mask filled again at a state reads them. `fast=False` decides
every candidate afresh without these (the reference the tests compare masks with, bit for bit).

Whether the rest of the output can complete once the item is fresh: its items are scalars, so no
unique array nests in another, and every companion array has at least minItems distinct values
(refused otherwise), so the items still required can always be fresh.

API (as JsonNameConstraint): `unique_items_for(constraint, domain, framing, fast=True)` gives
None or the companion; `apply(row, matcher)` after every fill, `accept(t)`, `accept_bytes(data)`,
`rollback(n)`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from services.grammar import json_text as jt
from services.grammar.json_probe import PROBE_BUDGET, Key, control
from services.grammar.unique_probe import ItemProbe, counted
from services.grammar.unique_scan import ItemScan
from shared.frontends.token_domain import TokenDomain

_WS = b" \t\n\r"
# States whose decisions are kept before the store starts over: the masks filled again at one
# state come close together (the lookahead's K+1 masks, a proposer's probe then the sampling),
# and a state holds up to a vocabulary's worth of decisions.
DECIDED_LIMIT = 64
class RepeatedItem(Exception):
    """The byte completed an item JSON-equal to an earlier item of its unique array."""


def _string_key(content: bytes) -> tuple:
    return ("s", content)


def _scalar_key(text: bytes) -> tuple:
    v = json.loads(text)
    if v is None:
        return ("z",)
    if isinstance(v, bool):
        return ("b", v)
    return ("n", v)  # int and float hash and compare by value: 1 == 1.0


class ItemReader:
    """The JSON text reader (json_text.py) with the schema positions of its values, the used
    items of each open companion array and the open item's text.

    A state is `(text, frames, item)`: `text` json_text's state; `frames` one per open
    container, `("o", position, member value position)` or `("a", position, items begun,
    ItemDomain or None, frozenset of used item keys)`; `item` None, `("s", name-reader state)`
    for an open string item of a companion array (json_text's name reader unescapes it), or
    `("n", text)` for an open scalar one."""

    refused = (RepeatedItem, jt.Duplicate)  # what `step` raises for a byte the text refuses

    def __init__(self, positions: Any) -> None:
        self.positions = positions

    def start(self, waiting: bool = False) -> tuple:
        return (jt.WAITING if waiting else jt.START, (), None)

    def step(self, state: tuple, byte: int) -> tuple:
        """The state after one byte; raises RepeatedItem, or json_text.Duplicate for a repeated
        member name (the name companion's to refuse)."""
        text, frames, item = state
        m0 = text[0]
        after = jt.step(text, byte)
        m1 = after[0]
        if m1 == jt.LOST:
            return (after, frames, None)
        if item is not None:
            kind, data = item
            if kind == "s":
                sub = jt.step(data, byte)
                if sub[0] == jt.COLON:  # the closing quote: the name set holds the content
                    frames = self._complete(frames, _string_key(next(iter(sub[3][-1]))))
                    item = None
                elif sub[0] == jt.LOST:
                    return ((jt.LOST, b"", b"", after[3]), frames, None)
                else:
                    item = ("s", sub)
            elif m1 == jt.SCALAR:
                item = ("n", data + bytes([byte]))
            else:
                frames = self._complete(frames, _scalar_key(data))
                item = None
        if m0 in (jt.VALUE, jt.VALUE0) and byte not in _WS and \
                not (m0 == jt.VALUE0 and byte == ord("]")):
            frames, pos = self._value_position(frames)
            if byte == ord("{"):
                frames += (("o", pos, None),)
            elif byte == ord("["):
                frames += (("a", pos, 0, self.positions.array(pos), frozenset()),)
            elif frames and frames[-1][0] == "a" and frames[-1][3] is not None:
                item = ("s", (jt.KEY, b"", b"", (frozenset(),))) if byte == ord('"') else \
                    ("n", bytes([byte]))
        elif m0 == jt.KEY and m1 == jt.COLON:
            name = next(iter(after[3][-1] - text[3][-1])).decode("utf-8", "surrogatepass")
            _, pos, _ = frames[-1]
            known = name if name in self.positions.declared(pos) else None
            frames = frames[:-1] + (("o", pos, self.positions.member(pos, known)),)
        if len(after[3]) < len(text[3]):
            frames = frames[:-1]
        return (after, frames, item)

    def _value_position(self, frames: tuple) -> tuple[tuple, Any]:
        if not frames:
            return frames, self.positions.root
        top = frames[-1]
        if top[0] == "o":
            return frames, top[2]
        _, pos, count, dom, used = top
        return frames[:-1] + (("a", pos, count + 1, dom, used),), self.positions.item(pos, count)

    @staticmethod
    def _complete(frames: tuple, key: tuple) -> tuple:
        _, pos, count, dom, used = frames[-1]
        if key in used:
            raise RepeatedItem
        return frames[:-1] + (("a", pos, count, dom, used | {key}),)

    def feed(self, state: tuple, data: bytes) -> tuple:
        for byte in data:
            state = self.step(state, byte)
        return state

    @staticmethod
    def settled(state: tuple) -> bool:
        """Whether every grammar continuation of this state keeps the innermost companion array's
        items unique up to its next item (see the module docstring); False: probe."""
        text, frames, item = state
        if not frames or frames[-1][0] != "a" or frames[-1][3] is None:
            return True
        _, _, _, dom, used = frames[-1]
        if item is None:
            return text[0] not in (jt.VALUE, jt.VALUE0) or len(used) < dom.at_least
        kind, data = item
        if kind == "s":
            done = data[1]
            return dom.open_strings or not any(k[0] == "s" and k[1].startswith(done) for k in used)
        return not any(s.startswith(data) for s in _spellings(dom, used))


def _spellings(dom: Any, used: frozenset) -> list[bytes]:
    """Every text the grammar can write for a used non-string item: the literal, and an integer
    part's canonical digits."""
    out: list[bytes] = []
    for k in used:
        if k[0] == "z":
            out.append(b"null")
        elif k[0] == "b":
            out.append(b"true" if k[1] else b"false")
        elif k[0] == "n":
            v = k[1]
            if float(v).is_integer():
                out.append(str(int(v)).encode())
            out += [t.encode() for t, lv in dom.literals
                    if not isinstance(lv, bool) and isinstance(lv, (int, float)) and lv == v]
    return out


class UniqueItemsConstraint:
    """The unique-items companion of one request's matcher (see the module docstring).
    `start`: None when the output is the JSON text itself, else the control token id after which
    it starts (a thinking framing's close token). `fast`: False decides every legal token
    afresh, each probe searched again and every whitespace token read (the reference the tests
    compare the masks with; the same mask, bit for bit)."""

    def __init__(self, positions: Any, domain: TokenDomain, start: int | None = None,
                 fast: bool = True) -> None:
        self.reader = ItemReader(positions)
        self.domain = domain
        self.start = start
        self.fast = fast
        self._scan = ItemScan(domain, fast)
        self._states = [self.reader.start(waiting=start is not None)]
        self._keys = [Key()]  # the digest of the output read up to each state
        self._probe = ItemProbe(self.reader, domain, cache=fast)
        # per state digest: the decision (keep) of each token decided there
        self._decided: dict[bytes, dict[int, bool]] = {}

    @property
    def probes(self) -> int:
        return self._probe.probes

    @property
    def gave_up(self) -> int:
        return self._probe.gave_up

    @property
    def accepted(self) -> int:
        return len(self._states) - 1

    @property
    def state(self) -> tuple:
        return self._states[-1]

    def _advance(self, state: tuple, token: int) -> tuple:
        if self.start is not None and token == self.start:
            return self.reader.start()
        if not self.domain.is_ordinary(token):
            return state
        return self.reader.feed(state, self.domain.token_bytes[token])

    def _key(self, key: Key, token: int) -> Key:
        if self.domain.is_ordinary(token):
            return key.extended(self.domain.token_bytes[token].replace(b"\xff", b"\xff\x00"))
        return key.extended(control(token))

    def accept(self, token: int) -> None:
        """Follow one token the matcher accepted (a repeat read anyway keeps the state)."""
        try:
            state = self._advance(self._states[-1], token)
        except (RepeatedItem, jt.Duplicate):
            state = self._states[-1]
        self._states.append(state)
        self._keys.append(self._key(self._keys[-1], token))

    def accept_bytes(self, data: bytes) -> None:
        """Follow bytes accepted outside any token (a continuation prefix; not undoable)."""
        try:
            self._states[-1] = self.reader.feed(self._states[-1], data)
        except (RepeatedItem, jt.Duplicate):
            pass
        self._keys[-1] = self._keys[-1].extended(data.replace(b"\xff", b"\xff\x00"))

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]
            del self._keys[-n:]

    def apply(self, row: torch.Tensor | np.ndarray, matcher) -> int:
        """Clear in `row` ([ceil(V/32)] int32, `matcher`'s mask at this state) every token that
        repeats an item or leaves only used items to complete; returns how many. `matcher` is
        probed and left as it was."""
        state = self._states[-1]
        if state[0][0] in (jt.WAIT, jt.DONE, jt.LOST):
            return 0
        words = (row.numpy() if isinstance(row, torch.Tensor) else row).view(np.uint32)
        key = self._keys[-1]
        decided: dict[int, bool] = {}
        if self.fast:  # the state's digest names the matcher's state: its decisions hold again
            if len(self._decided) >= DECIDED_LIMIT:
                self._decided.clear()
            decided = self._decided.setdefault(key.digest(), {})
        spaces = self.fast and state[2] is not None and state[2][0] == "n"
        space_keep = None
        cleared = 0
        for t in self._scan.candidates(state, words):
            keep = decided.get(t)
            if keep is None:
                if spaces and self._scan.tokens.space[t] and space_keep is not None:
                    # whitespace ends the open number or literal, and what follows is layout:
                    # every whitespace token decides as the first one did
                    keep = space_keep
                else:
                    keep = self._decide(matcher, state, key, t)
                    if spaces and self._scan.tokens.space[t]:
                        space_keep = keep
                decided[t] = keep
            if not keep:
                cleared += 1
                words[t >> 5] = int(words[t >> 5]) & ~(1 << (t & 31))
        return cleared

    def _decide(self, matcher, state: tuple, key: Key, t: int) -> bool:
        try:
            after = self._advance(state, t)
        except RepeatedItem:
            return False
        except jt.Duplicate:
            return True  # a repeated name: the name companion clears it
        if self.reader.settled(after):
            return True
        known = counted(after) if self.fast else None
        if known is not None:
            return known
        return self._probe.probe(matcher, t, after, self._key(key, t))

# ---------------------------------------------------------------- which outputs get one

def unique_items_for(constraint, domain: TokenDomain, framing: str | None = None,
                     fast: bool = True) -> UniqueItemsConstraint | None:
    """The companion of a json_schema content constraint with some array left to it
    (schema/unique_items.py); None for every other source (no cost for them)."""
    from shared.contract import ConstraintKind, OutputConstraint

    if not isinstance(constraint, OutputConstraint) or \
            constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return None
    positions = _positions(constraint)
    if positions is None:
        return None
    from services.grammar.json_names import _start_id

    return UniqueItemsConstraint(positions, domain, _start_id(framing, domain), fast)


@lru_cache(maxsize=256)
def _positions(constraint) -> Any:
    from services.grammar.schema import companion_positions

    if "uniqueItems" not in json.dumps(constraint.schema):  # no reduction for most schemas
        return None
    return companion_positions(constraint.schema)


def repeats_an_item(constraint, data: bytes) -> bool:
    """True when the JSON text `data` repeats an item of an array the companion keeps unique
    (`grammar check`: such a text is no output of the constraint)."""
    from shared.contract import ConstraintKind, OutputConstraint

    if not isinstance(constraint, OutputConstraint) or \
            constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return False
    positions = _positions(constraint)
    if positions is None:
        return False
    try:
        ItemReader(positions).feed((jt.START, (), None), data)
    except RepeatedItem:
        return True
    except jt.Duplicate:
        return False
    return False


__all__ = ["PROBE_BUDGET", "ItemReader", "RepeatedItem", "UniqueItemsConstraint",
           "repeats_an_item", "unique_items_for"]
