"""RawLengthConstraint: the length bounds of raw XML string arguments, counted beside the matcher.

Design document: "A raw string argument ends at \\n</parameter>, which must not occur in the
value ... A string's pattern/length and the delimiter exclusion hold together." The exact
automaton of both is the delimiter's KMP automaton (13 states) times a character count up to the
maximum; written as grammar rules, xgrammar precomputes each (state, count) rule against the
whole vocabulary, 0.3-0.6 s of compile per counted character on Qwen3.5's. So for such a value
the tool grammar writes the delimiter automaton alone (xml_values.py, `RawStrings.counted`) and
this companion counts: it follows the canonical framing of the tokens the matcher accepts (as the
ParameterNameConstraint does, param_names.py) and clears, in every mask the matcher fills, the
tokens after which no value within the bounds can still be written. The pair's language is the
exact one; neither alone is.

Lengths count Unicode scalar values, as JSON Schema does: a value is valid UTF-8 (the grammar's),
so its characters are its bytes that are not continuation bytes (0b10xxxxxx), counted when the
first byte of a character arrives.

Liveness. Inside a value, after `count` characters whose last `k` spell the delimiter's first
`k` (KMP state): the delimiter's first character, the line break, does not recur in it (no
border), so either the current match completes and the value ends where it began (length
`count - k`), or the value holds all `count` characters (a line break now starts a fresh match,
any other character extends the value). The reachable lengths are {count - k if k > 0} and every
length from `count` up, so the state is live iff `count <= max` or (k > 0 and
`min <= count - k <= max`); a completed delimiter fixes the length at `count - 13`, which must lie
in [min, max]. Reachable lengths only shrink as bytes arrive, so a token is legal iff its
simulation, byte by byte, never leaves the live states.

Masks. Most tokens ("plain": no line break, not a piece of the delimiter's tail, not able to
complete it) read from any value state simply add their characters and end outside any match;
they are legal iff they fit in what is left below the maximum, which one precomputed packed row
per remaining count clears at once. The others (433 of Qwen3.5's 248k: line breaks, pieces of
`</parameter>`) that stay in the value end in a state their character count and KMP tail give
(the delimiter has no border, so a broken match restarts from the start), judged together in
one vector operation; only the few that complete or continue the current match, or enter a
value from the framing, are simulated byte by byte. API:

    lengths = RawLengthConstraint(LengthIndex.of(domain), open_id, close_id,
                                  {"tool": {"param": (min, max or None)}})
    matcher.fill_next_token_bitmask(out, i); lengths.apply(out[i])
    matcher.accept_token(t);                 lengths.accept(t)      # False: refused
    matcher.rollback(n);                     lengths.rollback(n)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, NamedTuple

import numpy as np
import torch

from services.grammar.packed_masks import clear_bits, set_bits
from services.grammar.tools.param_names import value_end_next
from shared.frontends.formats.qwen_xml import CALL_HEAD, CALL_TAIL, PARAM_OPEN, VALUE_END
from shared.frontends.token_domain import TokenDomain

_HEAD, _TAIL, _OPEN, _END = (s.encode() for s in (CALL_HEAD, CALL_TAIL, PARAM_OPEN, VALUE_END))
_GT, _NL = ord(">"), ord("\n")
Bounds = tuple[int, int | None]  # (minLength, maxLength or None), in characters


def live(count: int, k: int, bounds: Bounds) -> bool:
    """Whether a value of `bounds` can still be written after `count` characters, the last `k`
    matching the delimiter's start (the module docstring's rule)."""
    lo, hi = bounds
    return hi is None or count <= hi or (k > 0 and lo <= count - k <= hi)


class State(NamedTuple):
    """Where the framing is (`mode`), the bytes of the literal or name being read (`aux`), the
    call's function and current parameter names, and inside a value its characters so far and
    KMP state."""

    mode: str
    aux: bytes = b""
    function: bytes = b""
    parameter: bytes = b""
    count: int = 0
    k: int = 0


_OUT = State("out")
_IDLE = frozenset({"out", "lost", "closer", "after", "next"})


class _Violation(Exception):
    """A simulated token leaves the live states of a bounded value."""


@dataclass(frozen=True, eq=False)
class LengthIndex:
    """Per vocabulary: each token's character count, the packed rows of plain tokens longer than
    r characters, and the special tokens with what their reading depends on."""

    domain: TokenDomain
    chars: np.ndarray  # [V] int32, characters of each token's bytes (0 for non-ordinary ids)
    keep: np.ndarray  # [max_chars + 1, mask_words] int32: row r + 1 clears plain tokens > r chars
    special: np.ndarray  # [S] int64 ids that are not plain
    special_chars: np.ndarray  # [S] int32
    tail: np.ndarray  # [S] int32: KMP state after the token's bytes read from state 0
    holds_end: np.ndarray  # [S] bool: the token's bytes hold the whole delimiter
    completes: np.ndarray  # [13, S] bool: [k] the token starts with the delimiter's end[k:]
    continues: np.ndarray  # [13, S] bool: [k] the token is a prefix of end[k:] (k >= 1)
    special_max: int  # the most characters of a special token

    @staticmethod
    def of(domain: TokenDomain) -> "LengthIndex":
        """The index of `domain` (built once per vocabulary)."""
        return _index(domain)

    @property
    def max_chars(self) -> int:
        return self.keep.shape[0] - 1

    def keep_within(self, r: int) -> np.ndarray:
        """[mask_words] int32: every bit set but those of plain tokens of more than `r`
        characters (r >= -1; r >= max_chars clears nothing)."""
        return self.keep[min(max(r, -1), self.max_chars - 1) + 1]


def _is_special(data: bytes, pieces: frozenset[bytes]) -> bool:
    """Whether reading `data` inside a value may do more than add its characters and end outside
    any match: a line break, a piece of the delimiter's tail, or a token that can complete it."""
    if b"\n" in data or (len(data) < len(_END) and data in pieces):
        return True
    return b">" in data and any(data.startswith(_END[k:]) for k in range(1, len(_END)))


@lru_cache(maxsize=8)
def _index(domain: TokenDomain) -> LengthIndex:
    pieces = frozenset(_END[k:j] for k in range(1, len(_END)) for j in range(k + 1, len(_END)))
    datas = domain.token_bytes
    n = len(datas)
    ordinary = np.ones(n, dtype=bool)
    ordinary[[t for t in domain.special_ids if 0 <= t < n]] = False
    lens = np.fromiter((len(b) for b in datas), dtype=np.int64, count=n)
    starts = np.concatenate([[0], np.cumsum(lens)])
    blob = np.frombuffer(b"".join(datas), dtype=np.uint8)
    lead = np.concatenate([[0], np.cumsum((blob & 0xC0) != 0x80)])
    chars = np.where(ordinary, lead[starts[1:]] - lead[starts[:-1]], 0).astype(np.int32)
    special = np.array([t for t in range(n) if ordinary[t] and _is_special(datas[t], pieces)],
                       dtype=np.int64)
    plain = ordinary.copy()
    plain[special] = False
    top = int(chars.max()) if n else 0
    bits = np.zeros((top + 1, domain.mask_words * 32), dtype=bool)
    bits[:, :n] = plain[None, :] & (chars[None, :] > np.arange(-1, top)[:, None])
    keep = ~np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    spelled = [datas[t] for t in special.tolist()]
    tails = []
    for data in spelled:
        k = 0
        for byte in data:
            k = value_end_next(k, byte)
        tails.append(k)
    size = len(_END)
    completes = np.array([[k > 0 and d.startswith(_END[k:]) for d in spelled]
                          for k in range(size)], dtype=bool).reshape(size, len(spelled))
    continues = np.array([[k > 0 and _END[k:].startswith(d) for d in spelled]
                          for k in range(size)], dtype=bool).reshape(size, len(spelled))
    return LengthIndex(domain, chars, keep, special, chars[special],
                       np.array(tails, dtype=np.int32),
                       np.array([_END in d for d in spelled], dtype=bool), completes, continues,
                       int(chars[special].max()) if len(special) else 0)



class RawLengthConstraint:
    """The length companion of one request's matcher (see the module docstring). `bounds`:
    function name -> parameter name -> (min, max or None) of the raw values it counts."""

    def __init__(self, index: LengthIndex, open_id: int, close_id: int,
                 bounds: Mapping[str, Mapping[str, Bounds]]) -> None:
        self.index = index
        self.open_id = open_id
        self.close_id = close_id
        self.bounds = {f.encode(): {p.encode(): b for p, b in ps.items()}
                       for f, ps in bounds.items() if ps}
        # the smallest maximum of each function's counted values: a token entering a value from
        # the framing adds at most its own characters
        self._least = {f: min((hi for _, hi in ps.values() if hi is not None), default=None)
                       for f, ps in self.bounds.items()}
        self._states: list[State] = [_OUT]

    @property
    def accepted(self) -> int:
        """Tokens accepted and not rolled back."""
        return len(self._states) - 1

    @property
    def state(self) -> State:
        return self._states[-1]

    def accept(self, token_id: int) -> bool:
        """Follow one token the matcher accepted; False (nothing changes) when it leaves the
        bounds (a mask from `apply` never allows one)."""
        try:
            state = self._advance(self._states[-1], token_id)
        except _Violation:
            return False
        self._states.append(state)
        return True

    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens (the matcher's rollback of the same `n`)."""
        if not 0 <= n <= self.accepted:
            raise ValueError(f"cannot roll back {n} of {self.accepted} tokens")
        if n:
            del self._states[-n:]

    def apply(self, row: torch.Tensor | np.ndarray) -> None:
        """Clear in `row` ([ceil(V/32)] int32, the matcher's mask) every token after which no value
        within its bounds can be written."""
        state = self._states[-1]
        table = self.bounds.get(state.function)
        if state.mode in _IDLE or table is None:
            return
        words = row.numpy() if isinstance(row, torch.Tensor) else row
        index = self.index
        if state.mode == "value":
            k = state.k
            exact = index.holds_end | index.completes[k]
            bounds = table.get(state.parameter)
            if bounds is not None and bounds[1] is not None:
                lo, hi = bounds
                if hi - state.count < index.max_chars:  # plain: legal iff they fit below hi
                    np.bitwise_and(words, index.keep_within(hi - state.count), out=words)
                exact = exact | index.continues[k]
                if hi - state.count < index.special_max:
                    # the other tokens that stay in the value end at (count + chars, their tail)
                    ends = state.count + index.special_chars
                    kept = ends - index.tail
                    fits = (ends <= hi) | ((index.tail > 0) & (kept >= lo) & (kept <= hi))
                    clear_bits(words, index.special[~exact & ~fits])
        else:  # a token entering a value adds at most its own characters to it
            least = self._least[state.function]
            exact = index.holds_end if least is None else \
                index.holds_end | (index.special_chars > least)
        # the rest, byte by byte: those that complete the delimiter, continue its match, or enter
        # a value from the framing
        ids = index.special[exact]
        for t in ids[set_bits(words, ids)].tolist():
            try:
                self._advance(state, t)
            except _Violation:
                clear_bits(words, np.array([t], dtype=np.int64))

    def _advance(self, state: State, token_id: int) -> State:
        framed = framing_token(state, token_id, self.open_id, self.close_id)
        if framed is not None:
            return framed
        domain = self.index.domain
        if not domain.is_ordinary(token_id):
            return state
        for byte in domain.token_bytes[token_id]:
            state = self._step(state, byte)
        return state

    def _step(self, s: State, byte: int) -> State:
        """One byte of text. Raises _Violation when it leaves a bounded value's live states."""
        nxt = framing_step(s, byte)
        if s.mode != "value":
            return nxt
        bounds = self.bounds.get(s.function, {}).get(s.parameter)
        if bounds is None:
            return nxt
        if nxt.mode == "sep":  # the delimiter completed: the value's length is fixed
            length = s.count + (byte & 0xC0 != 0x80) - len(_END)
            if length < bounds[0] or bounds[1] is not None and length > bounds[1]:
                raise _Violation
        elif not live(nxt.count, nxt.k, bounds):
            raise _Violation
        return nxt


def framing_token(s: State, token_id: int, open_id: int, close_id: int) -> State | None:
    """The state after the call opener or closer token (None for any other token): the XML
    framing's control-token step, shared by every companion that follows the framing."""
    if token_id == open_id:
        return State("head") if s.mode in ("out", "next") else State("lost")
    if token_id == close_id:
        return State("after") if s.mode == "closer" else State("lost")
    return None


def framing_step(s: State, byte: int) -> State:
    """One byte of the XML framing's text: where the call is, the function and parameter being
    written and, inside a value, its characters and the delimiter's KMP state."""
    mode = s.mode
    if mode == "value":
        k = value_end_next(s.k, byte)
        if k == len(_END):
            return s._replace(mode="sep", count=0, k=0)
        return s._replace(count=s.count + (byte & 0xC0 != 0x80), k=k)
    if mode == "head":
        aux = s.aux + bytes([byte])
        if not _HEAD.startswith(aux):
            return State("lost")
        return State("fname") if aux == _HEAD else s._replace(aux=aux)
    if mode in ("fname", "name"):
        if byte != _GT:
            return s._replace(aux=s.aux + bytes([byte]))
        if mode == "fname":
            return State("fname_nl", function=s.aux)
        return s._replace(mode="name_nl", aux=b"", parameter=s.aux)
    if mode in ("fname_nl", "name_nl", "sep"):
        if byte != _NL:
            return State("lost")
        return s._replace(mode="value" if mode == "name_nl" else "between", count=0, k=0)
    if mode == "between":
        aux = s.aux + bytes([byte])
        if aux == _OPEN:
            return s._replace(mode="name", aux=b"")
        if aux == _TAIL:
            return State("closer")
        if _OPEN.startswith(aux) or _TAIL.startswith(aux):
            return s._replace(aux=aux)
        return State("lost")
    if mode == "after":
        return State("next") if byte == _NL else State("lost")
    return s  # out, closer, next, lost: text changes nothing
