"""JsonLengthConstraint: the length bounds of JSON content strings, counted beside the matcher.

Where a string's place in the text fixes its schema (schema/lengths.py `counted_strings`), the
content grammar writes it without `maxLength`/`minLength` and this companion counts instead: it
follows the JSON text the matcher accepts (json_paths.py: the path from the root, and inside a
counted string its characters so far; one state per accepted token, so a rollback of n tokens
drops n states) and clears, in every mask the matcher fills, the tokens after which a counted
string can no longer keep its bounds. The pair's language is the exact bounded one: at a counted
position the bounded grammar differs from the unbounded one only by the count, and the rest of
the text never depends on a string's content.

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
escape state): the characters of their first string (the current one, or outside the first they
open), whether they close it, and the lengths of the strings they open (and close) after it. The
state says where a first string lands (the current string; outside, the value or name next, by
what precedes the token's quote: whitespace, `:` or `,`); a token whose later strings all fit
every counted bound is judged by its first string in one vector operation, and the rest (1,234
special tokens on Qwen3.5, few of them legal anywhere) are read byte by byte. API (the same
transactions as `json_names.JsonNameConstraint`):

    lengths = json_lengths_for(constraint, domain, framing)  # None: nothing counted
    matcher.fill_mask(out, i); lengths.apply(out[i])
    matcher.accept_token(t);   lengths.accept(t)      # False: refused (the mask never allows it)
    matcher.rollback(n);       lengths.rollback(n)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from services.grammar.json_paths import (
    AFTER,
    BACKSLASH,
    COLON,
    DONE,
    KEY,
    KEY0,
    KEYX,
    LETTER_U,
    LOST,
    QUOTE,
    STR,
    VALUE,
    VALUE0,
    WAIT,
    State,
    Violation,
    esc_next,
    step,
)
from services.grammar.packed_masks import clear_bits, set_bits
from services.grammar.schema.lengths import Counted, least_bounds
from shared.frontends.token_domain import TokenDomain

# the escape states a token may start in (json_paths.State.esc), each with its own scan
ESCAPES = (0, -1, 4, 3, 2, 1)
_OUTSIDE = len(ESCAPES)  # the scan variant of a token read outside any string
_BIG = 1 << 30
# What may precede a token's first `"` (whitespace around it) when that quote opens a string
# whose place the reader knows before the token: a value or key next, after a name, after a value
_BEFORE = (b"", b":", b",")
_WS_ONLY, _COLON, _COMMA = range(3)


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
            if byte == QUOTE:
                cur = [0, 0]
            continue
        if cur[1]:
            cur[1] = esc_next(cur[1], byte)
            continue
        if byte == QUOTE:
            if inside and not later and not closed:
                first, closed = cur[0], True
            else:
                later.append((cur[0], True))
            cur = None
            continue
        if byte == BACKSLASH or byte & 0xC0 != 0x80:
            cur[0] += 1
            if byte == BACKSLASH:
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
    first_u[lens > 0] = blob[starts[lens > 0]] == LETTER_U
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
        self._every = np.ones(len(index.special), dtype=bool)
        self._no = ~self._every
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
        except Violation:
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
        except Violation:
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
        if s.mode in (STR, KEY):  # every token's first string is the current one
            v, count, place = ESCAPES.index(s.esc), s.count, s.bounds
            known = self._every
            if place is not None and place[1] is not None:
                left = place[1] - count  # plain tokens: legal iff they fit what is left
                if left < index.keep.shape[1] - 1:
                    np.bitwise_and(words, index.keep[v, max(left, -1) + 1], out=words)
        else:
            v, count = _OUTSIDE, 0
            kind, place = _first_string(s)
            known = self._no if kind is None else index.before == kind
        # a token whose first string lands where the state says needs reading only for its later
        # strings; any other, for every string it opens
        read = np.where(known, ~self._loose[v], ~self._loose_all[v])
        if isinstance(place, tuple):  # that first string is counted: the vectors judge it
            lo, hi = place
            ends = count + index.first[v]
            fits = (ends <= (_BIG if hi is None else hi)) & (~index.closes[v] | (ends >= lo))
            clear_bits(words, index.special[known & ~fits & ~read])
        ids = index.special[read]
        for t in ids[set_bits(words, ids)].tolist():
            try:
                self._advance(s, t)
            except Violation:
                clear_bits(words, np.array([t], dtype=np.int64))


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

    # the reduction the content compile makes (compiler.build_grammar / build_lark)
    reduced = check_schema(constraint.schema, unique_names=True, unique_items=True)
    return counted_strings(reduced.root)
