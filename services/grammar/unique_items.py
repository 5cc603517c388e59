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
   state, exhaustively over the used items' spellings (finite), `PROBE_BUDGET` bytes at most.

Whether the rest of the output can complete once the item is fresh: its items are scalars, so no
unique array nests in another, and every companion array has at least minItems distinct values
(refused otherwise), so the items still required can always be fresh.

API (as JsonNameConstraint): `unique_items_for(constraint, domain, framing)` gives None or the
companion; `apply(row, matcher)` after every fill, `accept(t)`, `accept_bytes(data)`,
`rollback(n)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from services.grammar import json_text as jt
from services.grammar.json_names import JsonNameIndex
from shared.frontends.token_domain import TokenDomain

PROBE_BUDGET = 4096  # bytes one probe may try before it gives up and keeps the token
_WS = b" \t\n\r"


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


@dataclass(frozen=True, eq=False)
class _Tokens:
    """Per vocabulary: quotes per token, whitespace-only tokens, tokens that only open a string
    (whitespace and commas, then their one quote), tokens holding `[`."""

    quotes: np.ndarray  # [V] int16
    space: np.ndarray  # [V] bool
    opens: np.ndarray  # [V] bool
    brackets: np.ndarray  # int64 ids


@lru_cache(maxsize=8)
def _tokens(domain: TokenDomain) -> _Tokens:
    quotes = np.zeros(domain.size, dtype=np.int16)
    space = np.zeros(domain.size, dtype=bool)
    opens = np.zeros(domain.size, dtype=bool)
    brackets = []
    for t, data in enumerate(domain.token_bytes):
        if not data or not domain.is_ordinary(t):
            continue
        quotes[t] = data.count(b'"')
        space[t] = not data.strip(_WS)
        opens[t] = quotes[t] == 1 and not data.split(b'"')[0].strip(_WS + b",")
        if b"[" in data:
            brackets.append(t)
    return _Tokens(quotes, space, opens, np.array(brackets, dtype=np.int64))


class UniqueItemsConstraint:
    """The unique-items companion of one request's matcher (see the module docstring).
    `start`: None when the output is the JSON text itself, else the control token id after which
    it starts (a thinking framing's close token)."""

    def __init__(self, positions: Any, domain: TokenDomain, start: int | None = None) -> None:
        self.reader = ItemReader(positions)
        self.domain = domain
        self.start = start
        self._tokens = _tokens(domain)
        self._exact = JsonNameIndex.of(domain).exact
        self._states = [self.reader.start(waiting=start is not None)]
        self.probes = 0
        self.gave_up = 0
        self._scratch: np.ndarray | None = None

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

    def accept(self, token: int) -> None:
        """Follow one token the matcher accepted (a repeat read anyway keeps the state)."""
        try:
            state = self._advance(self._states[-1], token)
        except (RepeatedItem, jt.Duplicate):
            state = self._states[-1]
        self._states.append(state)

    def accept_bytes(self, data: bytes) -> None:
        """Follow bytes accepted outside any token (a continuation prefix; not undoable)."""
        try:
            self._states[-1] = self.reader.feed(self._states[-1], data)
        except (RepeatedItem, jt.Duplicate):
            pass

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]

    def apply(self, row: torch.Tensor | np.ndarray, matcher) -> int:
        """Clear in `row` ([ceil(V/32)] int32, `matcher`'s mask at this state) every token that
        repeats an item or leaves only used items to complete; returns how many. `matcher` is
        probed and left as it was."""
        state = self._states[-1]
        if state[0][0] in (jt.WAIT, jt.DONE, jt.LOST):
            return 0
        words = (row.numpy() if isinstance(row, torch.Tensor) else row).view(np.uint32)
        cleared = 0
        memo: dict[tuple, bool] = {}
        for t in self._candidates(state, words):
            try:
                after = self._advance(state, t)
            except RepeatedItem:
                keep = False
            except jt.Duplicate:
                keep = True  # a repeated name: the name companion clears it
            else:
                keep = self.reader.settled(after) or self._probe(matcher, t, after, memo)
            if not keep:
                cleared += 1
                words[t >> 5] = int(words[t >> 5]) & ~(1 << (t & 31))
        return cleared

    def _candidates(self, state: tuple, words: np.ndarray) -> list[int]:
        # The legal tokens that can complete an item or leave an unsettled state: outside a
        # companion array only a token holding `[` can enter one; inside, in an open string
        # item, a quote ends it (or, for a closed string part, the content can near a used
        # one); in an open scalar item every legal token; between items every legal token but
        # whitespace (layout leaves the state as it is) and, where strings are open, one that
        # only opens a string item.
        tok = self._tokens
        text, frames, item = state
        if not frames or frames[-1][0] != "a" or frames[-1][3] is None:
            ids = tok.brackets
            ids = ids[ids < 32 * len(words)]
            legal = (words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1
            return ids[legal.astype(bool)].tolist()
        dom, used = frames[-1][3], frames[-1][4]
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:self.domain.size]
        ids = np.flatnonzero(bits)
        if item is not None and item[0] == "s":
            keep = tok.quotes[ids] > 0
            if not dom.open_strings:
                extend = set()
                done = item[1][1]
                for k in used:
                    if k[0] == "s" and k[1].startswith(done):
                        rest = k[1][len(done):]
                        for n in range(1, len(rest) + 1):
                            extend.update(self._exact.get(rest[:n], ()))
                keep |= np.isin(ids, np.fromiter(extend, dtype=np.int64)) | \
                    np.isin(ids, self._escapes())
            return ids[keep].tolist()
        if item is not None:  # an open scalar: whitespace ends it too
            return ids.tolist()
        keep = ~tok.space[ids]
        if dom.open_strings:
            keep &= ~tok.opens[ids]
        return ids[keep].tolist()

    def _escapes(self) -> np.ndarray:
        return JsonNameIndex.of(self.domain).escapes

    def _probe(self, matcher, token: int, after: tuple, memo: dict) -> bool:
        if after in memo:
            return memo[after]
        self.probes += 1
        if not matcher.accept_token(token):
            return False
        budget = [PROBE_BUDGET]
        try:
            found = self._search(matcher, after, budget, set())
        finally:
            matcher.rollback(1)
        if budget[0] <= 0:
            self.gave_up += 1
            found = True
        memo[after] = found
        return found

    def _search(self, matcher, state: tuple, budget: list[int], seen: set) -> bool:
        # Depth-first over the single bytes the grammar takes, until a settled state (True) or
        # every way is used up (False). `seen`: states already searched (whitespace between
        # items returns to the same state; layout never changes which items may follow).
        if self.reader.settled(state) or budget[0] <= 0:
            return True
        if state in seen:
            return False
        seen.add(state)
        for byte in self._legal_bytes(matcher, budget):
            t = self.domain.byte_token_ids[byte]
            budget[0] -= 1
            if not matcher.accept_token(t):
                continue
            try:
                if self._search(matcher, self.reader.step(state, byte), budget, seen):
                    return True
            except (RepeatedItem, jt.Duplicate):
                pass
            finally:
                matcher.rollback(1)
            if budget[0] <= 0:
                return True
        return False

    def _legal_bytes(self, matcher, budget: list[int]) -> list[int]:
        domain = self.domain
        if self._scratch is None:
            self._scratch = np.zeros((1, domain.mask_words), dtype=np.int32)
        matcher.fill_mask(self._scratch, 0)
        budget[0] -= 16
        words = self._scratch[0].view(np.uint32)
        return [b for b, t in enumerate(domain.byte_token_ids)
                if t >= 0 and (int(words[t >> 5]) >> (t & 31)) & 1]


# ---------------------------------------------------------------- which outputs get one

def unique_items_for(constraint, domain: TokenDomain,
                     framing: str | None = None) -> UniqueItemsConstraint | None:
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

    return UniqueItemsConstraint(positions, domain, _start_id(framing, domain))


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
