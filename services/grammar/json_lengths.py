"""JsonLengthConstraint: the length bounds of JSON content strings, counted beside the matcher.

Where a string's place in the text fixes its schema (schema/lengths.py `counted_strings`), the
content grammar writes it without `maxLength`/`minLength` and this companion counts instead: it
follows the JSON text the matcher accepts (its own reader: the path from the root, and inside a
counted string its characters so far) and clears, in every mask the matcher fills, the tokens
after which that string can no longer keep its bounds. The pair's language is the exact bounded
one: at a counted position the bounded grammar differs from the unbounded one only by the count,
and the rest of the text never depends on a string's content.

Counting: characters are Unicode scalar values, as JSON Schema counts. The grammar writes
canonical escapes only (schema/strings.py: `\\"` `\\\\` `\\b` `\\f` `\\n` `\\r` `\\t` and
`\\u00xx` for the other controls: no surrogate escapes), so a character is counted when its
first byte arrives: a lead byte of raw UTF-8 (not 0b10xxxxxx) or the `\\` of an escape; the
escape's other bytes count nothing. A string at `count` characters is live iff count <= max;
its closing quote is legal iff min <= count.

Masks (`JsonLengthIndex`, once per vocabulary): tokens without `"` or `\\` ("plain") inside a
counted string only add characters, and are legal iff they fit what is left: one precomputed
packed row per count left clears them (a row set per escape state, since a token read just after
`\\` or inside `\\u00xx` first finishes the escape). The others ("special": a few thousand) are
described by a scan of their bytes from each start (outside any string, or inside one in each
escape state): the characters of the current string before its closing quote, whether they close
it, and the lengths of the strings they open (and close) afterwards. A special token whose later
strings all fit every counted bound is judged by its first string in one vector operation; the
rest, and every legal token that opens a counted string in a way the vectors do not cover, are
read byte by byte. API (the same transactions as `json_names.JsonNameConstraint`):

    lengths = json_lengths_for(constraint, domain, framing)  # None: nothing counted
    matcher.fill_mask(out, i); lengths.apply(out[i])
    matcher.accept_token(t);   lengths.accept(t)      # False: refused (the mask never allows it)
    matcher.rollback(n);       lengths.rollback(n)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import torch

from services.grammar.schema.lengths import Counted, CountedArray, CountedObject, least_bounds
from shared.frontends.token_domain import TokenDomain

# reader modes
WAIT, VALUE, VALUE0, KEY0, KEYX, KEY, COLON, STR, SCALAR, AFTER, DONE, LOST = range(12)
_WS = frozenset(b" \t\n\r")
_Q, _BS, _U = ord('"'), ord("\\"), ord("u")
# escape states: 0 none, -1 just after `\`, k > 0: hex digits of `\u` still to come
ESCAPES = (0, -1, 4, 3, 2, 1)
_OUTSIDE = len(ESCAPES)  # the scan variant of a token read outside any string
_BIG = 1 << 30
# What may precede a token's first `"` (whitespace around it) when that quote opens a string
# whose place the reader knows before the token: a value or key next, after a name, after a value
_BEFORE = (b"", b":", b",")
_WS_ONLY, _COLON, _COMMA = range(3)


class State(NamedTuple):
    """`mode`; `stack`: per open container (is_array, counted subtree or None, element index);
    `child`: the counted subtree of the value being read or next; in a string or name: `esc`,
    and for a counted string its `bounds` and `count`; in a name its bytes so far."""

    mode: int
    stack: tuple = ()
    child: Counted | None = None
    bounds: tuple | None = None
    count: int = 0
    esc: int = 0
    name: bytes = b""


class _Violation(Exception):
    """A byte leaves a counted string's bounds."""


def _esc_next(esc: int, byte: int) -> int:
    if esc == -1:
        return 4 if byte == _U else 0
    return esc - 1


def _open(child: Counted | None, byte: int, s: State) -> State:
    """The first byte of a value."""
    if byte == ord("{"):
        sub = child if isinstance(child, CountedObject) else None
        return State(KEY0, s.stack + ((False, sub, 0),))
    if byte == ord("["):
        sub = child if isinstance(child, CountedArray) else None
        return State(VALUE0, s.stack + ((True, sub, 0),), None if sub is None else sub.child(0))
    if byte == _Q:
        return State(STR, s.stack, None, child if isinstance(child, tuple) else None)
    return State(SCALAR, s.stack)


def _after(byte: int, stack: tuple) -> State:
    if byte == ord(","):
        is_array, sub, n = stack[-1]
        if not is_array:
            return State(KEYX, stack)
        return State(VALUE, stack[:-1] + ((True, sub, n + 1),),
                     None if sub is None else sub.child(n + 1))
    if byte in (ord("}"), ord("]")):
        rest = stack[:-1]
        return State(AFTER if rest else DONE, rest)
    return State(LOST, stack)


def step(s: State, byte: int) -> State:
    """The state after one byte the grammar accepted; raises _Violation past a counted bound."""
    mode = s.mode
    if mode == STR:
        if s.esc:
            return s._replace(esc=_esc_next(s.esc, byte))
        if byte == _Q:
            if s.bounds is not None and s.count < s.bounds[0]:
                raise _Violation
            return State(AFTER if s.stack else DONE, s.stack)
        if byte == _BS or byte & 0xC0 != 0x80:
            if s.bounds is not None:
                hi = s.bounds[1]
                if hi is not None and s.count >= hi:
                    raise _Violation
                s = s._replace(count=s.count + 1)
            if byte == _BS:
                return s._replace(esc=-1)
        return s
    if mode == KEY:
        if s.esc:
            return s._replace(esc=_esc_next(s.esc, byte), name=s.name + bytes([byte]))
        if byte == _Q:
            _, sub, _ = s.stack[-1]
            return State(COLON, s.stack, None if sub is None else sub.child(s.name))
        return s._replace(esc=-1 if byte == _BS else 0, name=s.name + bytes([byte]))
    if mode in (WAIT, DONE, LOST):
        return s
    if byte in _WS:
        return State(AFTER if s.stack else DONE, s.stack) if mode == SCALAR else s
    if mode in (VALUE, VALUE0):
        if mode == VALUE0 and byte == ord("]"):
            return _after(byte, s.stack)
        return _open(s.child, byte, s)
    if mode in (KEY0, KEYX):
        if byte == _Q:
            return State(KEY, s.stack)
        return _after(byte, s.stack) if mode == KEY0 and byte == ord("}") else State(LOST, s.stack)
    if mode == COLON:
        return State(VALUE, s.stack, s.child) if byte == ord(":") else State(LOST, s.stack)
    if mode == SCALAR:
        return _after(byte, s.stack) if byte in (ord(","), ord("}"), ord("]")) else s
    return _after(byte, s.stack)  # AFTER


def _scan(data: bytes, inside: bool, esc: int) -> tuple[int, bool, list[tuple[int, bool]]]:
    """Read `data` from inside a string in escape state `esc` (or outside any string): the
    characters of the current string and whether they close it (0, False outside), then every
    string the bytes open after that: (characters, closed)."""
    first, closed, later = 0, False, []
    cur: list | None = None  # [characters, esc] of the string being read
    if inside:
        cur = [0, esc]
    for byte in data:
        if cur is None:
            if byte == _Q:
                cur = [0, 0]
            continue
        if cur[1]:
            cur[1] = _esc_next(cur[1], byte)
            continue
        if byte == _Q:
            if inside and not later and not closed:
                first, closed = cur[0], True
            else:
                later.append((cur[0], True))
            cur = None
            continue
        if byte == _BS or byte & 0xC0 != 0x80:
            cur[0] += 1
            if byte == _BS:
                cur[1] = -1
    if cur is not None:
        if inside and not closed and not later:
            first = cur[0]
        else:
            later.append((cur[0], False))
    return first, closed, later


@dataclass(frozen=True, eq=False)
class JsonLengthIndex:
    """Per vocabulary: the packed keep rows of plain tokens per escape state and count left, and
    the scans of the special tokens per start (`ESCAPES`, then outside)."""

    domain: TokenDomain
    keep: np.ndarray  # [len(ESCAPES), max + 1, mask_words] int32: row r + 1 clears plain > r
    special: np.ndarray  # [S] int64
    first: np.ndarray  # [len(ESCAPES) + 1, S] int32: characters of the current string
    closes: np.ndarray  # [len(ESCAPES) + 1, S] bool: they close it
    open_max: np.ndarray  # [len(ESCAPES) + 1, S] int32: most characters of a later string
    closed_min: np.ndarray  # [len(ESCAPES) + 1, S] int32: fewest of a later string it closes
    before: np.ndarray  # [S] int8: what precedes the token's first `"` (`_BEFORE`)

    @staticmethod
    def of(domain: TokenDomain) -> "JsonLengthIndex":
        return _index(domain)


@lru_cache(maxsize=8)
def _index(domain: TokenDomain) -> JsonLengthIndex:
    datas = domain.token_bytes
    n = len(datas)
    ordinary = np.zeros(n, dtype=bool)
    ordinary[[t for t in range(n) if domain.is_ordinary(t) and datas[t]]] = True
    special_mask = ordinary & np.fromiter((b'"' in d or b"\\" in d for d in datas), bool, n)
    plain = ordinary & ~special_mask
    lens = np.fromiter((len(b) for b in datas), dtype=np.int64, count=n)
    starts = np.concatenate([[0], np.cumsum(lens)])[:-1]
    blob = np.frombuffer(b"".join(datas), dtype=np.uint8)
    lead = np.concatenate([[0], np.cumsum((blob & 0xC0) != 0x80)])
    first_u = np.zeros(n, dtype=bool)
    first_u[lens > 0] = blob[starts[lens > 0]] == _U
    rows = []
    for esc in ESCAPES:  # a plain token first finishes the pending escape
        skip = np.zeros(n, dtype=np.int64) + (esc if esc > 0 else 0)
        if esc == -1:
            skip = np.where(first_u, 5, 1)
        skip = np.minimum(skip, lens)
        chars = np.where(plain, lead[starts + lens] - lead[starts + skip], 0)
        rows.append(chars)
    top = int(max(r.max() for r in rows)) if n else 0
    keep = np.empty((len(ESCAPES), top + 1, domain.mask_words), dtype=np.int32)
    for e, chars in enumerate(rows):
        bits = np.zeros((top + 1, domain.mask_words * 32), dtype=bool)
        bits[:, :n] = chars[None, :] > np.arange(-1, top)[:, None]
        keep[e] = ~np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    special = np.flatnonzero(special_mask).astype(np.int64)
    v = len(ESCAPES) + 1
    first = np.zeros((v, len(special)), dtype=np.int32)
    closes = np.zeros((v, len(special)), dtype=bool)
    open_max = np.full((v, len(special)), -1, dtype=np.int32)
    closed_min = np.full((v, len(special)), _BIG, dtype=np.int32)
    for j, t in enumerate(special.tolist()):
        for e in range(v):
            inside = e < len(ESCAPES)
            f, c, later = _scan(datas[t], inside, ESCAPES[e] if inside else 0)
            if not inside and later:  # outside: the first string opened is the "current" one
                (f, c), later = later[0], later[1:]
            first[e, j], closes[e, j] = f, c
            open_max[e, j] = max((k for k, _ in later), default=-1)
            closed_min[e, j] = min((k for k, done in later if done), default=_BIG)
    before = np.array([_before(datas[t]) for t in special.tolist()], dtype=np.int8)
    return JsonLengthIndex(domain, keep, special, first, closes, open_max, closed_min, before)


def _before(data: bytes) -> int:
    """The class of the bytes before the first `"` of `data` (`_BEFORE`; -1: none of them)."""
    if b'"' not in data:
        return -1
    head = data.split(b'"', 1)[0].strip(b" \t\n\r")
    return _BEFORE.index(head) if head in _BEFORE else -1


def _set_bits(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    return ((words[ids >> 5].view(np.uint32) >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def _clear_bits(words: np.ndarray, ids: np.ndarray) -> None:
    if len(ids):
        np.bitwise_and.at(words, ids >> 5,
                          (~(np.uint32(1) << (ids & 31).astype(np.uint32))).view(np.int32))


class JsonLengthConstraint:
    """The length companion of one request's matcher. `counted`: `counted_strings` of the
    schema's root; `start`: as for JsonNameConstraint (None: the output is the JSON text)."""

    def __init__(self, index: JsonLengthIndex, counted: Counted, start: int | None = None) -> None:
        self.index = index
        self.counted = counted
        self.start = start
        least_hi, most_lo = least_bounds(counted)
        hi = _BIG if least_hi is None else least_hi
        # later strings that fit every bound: a token whose later strings all do needs no reading
        self._loose = (index.open_max <= hi) & (index.closed_min >= most_lo)
        first_fits = (index.first <= hi) & (~index.closes | (index.first >= most_lo))
        self._loose_all = self._loose.copy()
        self._loose_all[_OUTSIDE] &= first_fits[_OUTSIDE]
        self._states = [State(VALUE, child=counted) if start is None else State(WAIT)]

    @property
    def accepted(self) -> int:
        return len(self._states) - 1

    @property
    def state(self) -> State:
        return self._states[-1]

    def accept(self, token_id: int) -> bool:
        try:
            state = self._advance(self._states[-1], token_id)
        except _Violation:
            return False
        self._states.append(state)
        return True

    def after_bytes(self, data: bytes) -> State | None:
        """The state after `data` from the current one; None when they leave a bound."""
        try:
            state = self._states[-1]
            if state.mode != WAIT:
                for byte in data:
                    state = step(state, byte)
        except _Violation:
            return None
        return state

    def accept_bytes(self, data: bytes) -> bool:
        """Follow bytes the matcher takes outside any token (not undoable by rollback); False
        (nothing changes) when they leave a bound."""
        state = self.after_bytes(data)
        if state is None:
            return False
        self._states[-1] = state
        return True

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]

    def _advance(self, state: State, token_id: int) -> State:
        if token_id == self.start and state.mode == WAIT:
            return State(VALUE, child=self.counted)
        domain = self.index.domain
        if state.mode in (WAIT, DONE, LOST) or not domain.is_ordinary(token_id):
            return state
        for byte in domain.token_bytes[token_id]:
            state = step(state, byte)
        return state

    def apply(self, row: torch.Tensor | np.ndarray) -> None:
        """Clear in `row` ([ceil(V/32)] int32, the matcher's mask) every token after which some
        counted string can no longer keep its bounds."""
        s = self._states[-1]
        if s.mode in (WAIT, DONE, LOST):
            return
        words = row.numpy() if isinstance(row, torch.Tensor) else row
        index = self.index
        bounds, count = None, 0
        if s.mode in (STR, KEY):
            v = ESCAPES.index(s.esc)
            bounds, count = s.bounds, s.count
            if bounds is not None and bounds[1] is not None:
                left = bounds[1] - count
                if left < index.keep.shape[1] - 1:
                    np.bitwise_and(words, index.keep[v, max(left, -1) + 1], out=words)
            judged = np.ones(len(index.special), dtype=bool) if bounds is not None else None
        else:
            v = _OUTSIDE
            kind, place = _first_string(s)
            judged = None
            if kind is not None:  # tokens of `kind` open their first string at `place`
                known = index.before == kind
                if isinstance(place, tuple):
                    bounds, judged = place, known
                else:  # a name or an uncounted value: only later strings matter
                    read = (known & ~self._loose[v]) | (~known & ~self._loose_all[v])
                    judged = False
        if judged is False:
            pass
        elif judged is None:  # no counted string is current: only later strings matter
            read = ~(self._loose_all[v] if v == _OUTSIDE else self._loose[v])
        else:
            lo, hi = bounds
            hi = _BIG if hi is None else hi
            ends = count + index.first[v]
            closes = index.closes[v]
            fits = (ends <= hi) & (~closes | (ends >= lo))
            read = (judged & ~self._loose[v]) | (~judged & ~self._loose_all[v])
            _clear_bits(words, index.special[judged & ~fits & ~read])
        ids = index.special[read]
        for t in ids[_set_bits(words, ids)].tolist():
            try:
                self._advance(s, t)
            except _Violation:
                _clear_bits(words, np.array([t], dtype=np.int64))


def _first_string(s: State) -> tuple[int | None, Counted | None]:
    """Outside any string: the `_BEFORE` class of the tokens whose first `"` opens a string at a
    place the state fixes, and the counted subtree there (None: a name or an uncounted value);
    (None, None) where no class does."""
    if s.mode in (VALUE, VALUE0):
        return _WS_ONLY, s.child
    if s.mode == COLON:
        return _COLON, s.child
    if s.mode in (KEY0, KEYX):
        return _WS_ONLY, None
    if s.mode == AFTER and s.stack:
        is_array, sub, n = s.stack[-1]
        return _COMMA, (sub.child(n + 1) if is_array and sub is not None else None)
    return None, None


def json_lengths_for(constraint, domain: TokenDomain,
                     framing: str | None = None) -> JsonLengthConstraint | None:
    """The companion of a content constraint whose grammar leaves string lengths to it (a
    json_schema with counted strings: schema/lengths.py); None for every other source.
    `framing`: the compile framing (a thinking framing starts the JSON after its close token).
    Raises what `check_schema` raises for an invalid schema."""
    from services.grammar.json_names import _start_id
    from shared.contract import ConstraintKind, OutputConstraint

    if not isinstance(constraint, OutputConstraint) or \
            constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return None
    counted = _counted(constraint)
    if counted is None:
        return None
    return JsonLengthConstraint(JsonLengthIndex.of(domain), counted, _start_id(framing, domain))


@lru_cache(maxsize=256)
def _counted(constraint) -> Counted | None:
    from services.grammar.schema import check_schema
    from services.grammar.schema.lengths import counted_strings

    return counted_strings(check_schema(constraint.schema, unique_names=True).root)
