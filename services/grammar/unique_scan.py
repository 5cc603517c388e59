"""Which tokens of one mask the unique-items companion (unique_items.py) must decide, and the
per-vocabulary indexes that find them without reading every legal token.

Outside a companion array only a token holding `[` can enter one (inside a string, only one that
also holds a quote); inside, in an open string item, a quote ends it (for a closed string part,
content that goes on along a used item can near it too: for a token holding an escape, its
unescaped content decides); in an open scalar item every legal token; between items every legal
token but whitespace (layout leaves the state as it is) and, where strings are open, one that
only opens a string item. `ItemScan(fast=False)` reads every legal token of the cases above
without the indexes (the reference the tests compare with).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from services.grammar import json_text as jt
from services.grammar.json_names import JsonNameIndex
from shared.frontends.token_domain import TokenDomain

_WS = b" \t\n\r"
_IN_STRING = (jt.KEY, jt.STR, jt.STR_ESC)  # json_text modes inside a name or a string value


@dataclass(frozen=True, eq=False)
class _Tokens:
    """Per vocabulary: quotes per token, whitespace-only tokens, tokens that only open a string
    (whitespace and commas, then their one quote), tokens holding `[`, and as ids those holding a
    quote and the whitespace-only ones."""

    quotes: np.ndarray  # [V] int16
    space: np.ndarray  # [V] bool
    opens: np.ndarray  # [V] bool
    brackets: np.ndarray  # int64 ids
    quoted_brackets: np.ndarray  # int64 ids: those also holding a quote
    quoted: np.ndarray  # int64 ids
    spaces: np.ndarray  # int64 ids
    # Closers: tokens `c"` + layout, commas and closers only (c without a backslash), by c; the
    # other quoted tokens as ids. In an open string, a closer only ends the item with content +
    # c (what follows starts no item and enters no array).
    closers: dict[bytes, np.ndarray]
    unclosing: np.ndarray  # int64 ids
    # Tokens holding a backslash and no quote, by the content they add to a string outside an
    # escape (unescaped; an escape they leave open adds nothing yet); None: not string content.
    escaped: dict[bytes | None, tuple[int, ...]]


@lru_cache(maxsize=8)
def _tokens(domain: TokenDomain) -> _Tokens:
    quotes = np.zeros(domain.size, dtype=np.int16)
    space = np.zeros(domain.size, dtype=bool)
    opens = np.zeros(domain.size, dtype=bool)
    brackets = []
    closers: dict[bytes, list[int]] = {}
    unclosing = []
    escaped: dict[bytes | None, list[int]] = {}
    for t, data in enumerate(domain.token_bytes):
        if not data or not domain.is_ordinary(t):
            continue
        quotes[t] = data.count(b'"')
        space[t] = not data.strip(_WS)
        opens[t] = quotes[t] == 1 and not data.split(b'"')[0].strip(_WS + b",")
        if b"[" in data:
            brackets.append(t)
        if quotes[t]:
            content, _, rest = data.partition(b'"')
            if quotes[t] == 1 and b"\\" not in content and not rest.strip(_WS + b",]}"):
                closers.setdefault(content, []).append(t)
            else:
                unclosing.append(t)
        elif b"\\" in data:
            escaped.setdefault(_content(data), []).append(t)
    brackets = np.array(brackets, dtype=np.int64)
    return _Tokens(quotes, space, opens, brackets, brackets[quotes[brackets] > 0],
                   np.flatnonzero(quotes > 0), np.flatnonzero(space),
                   {c: np.array(ids, dtype=np.int64) for c, ids in closers.items()},
                   np.array(unclosing, dtype=np.int64),
                   {c: tuple(ids) for c, ids in escaped.items()})


def _content(data: bytes) -> bytes | None:
    # What `data` adds, unescaped, to an open string outside an escape (json_text's name reader).
    state = (jt.KEY, b"", b"", (frozenset(),))
    for byte in data:
        state = jt.step(state, byte)
        if state[0] != jt.KEY:
            return None
    return state[1]


def _legal(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The ids among `ids` whose bit is set in the packed row `words` ([ceil(V/32)] uint32)."""
    ids = ids[ids < 32 * len(words)]
    return ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)]


def _set_ids(words: np.ndarray, size: int) -> np.ndarray:
    """Every id whose bit is set, unpacking only the non-zero words (most masks in an array are
    sparse: a value's first tokens, or a number's digits and closers)."""
    nz = np.flatnonzero(words)
    bits = np.unpackbits(words[nz].view(np.uint8), bitorder="little").reshape(len(nz), 32)
    rows, cols = np.nonzero(bits)
    ids = nz[rows].astype(np.int64) * 32 + cols
    return ids[ids < size]


class ItemScan:
    """The candidates of one companion's masks over `domain`."""

    def __init__(self, domain: TokenDomain, fast: bool = True) -> None:
        self.domain = domain
        self.fast = fast
        self.tokens = _tokens(domain)
        self._exact = JsonNameIndex.of(domain).exact

    def candidates(self, state: tuple, words: np.ndarray) -> list[int]:
        """The tokens set in `words` (a packed mask row, uint32) that the companion must decide
        in reader state `state` (the module docstring says which)."""
        tok = self.tokens
        text, frames, item = state
        if not frames or frames[-1][0] != "a" or frames[-1][3] is None:
            if self.fast and text[0] in _IN_STRING:  # a `[` there is content until a quote
                return _legal(words, tok.quoted_brackets).tolist()
            return _legal(words, tok.brackets).tolist()
        dom, used = frames[-1][3], frames[-1][4]
        if self.fast and item is not None and item[0] == "s":  # inside a string: most are legal
            done = item[1][1]
            if item[1][2] or not (dom.open_strings or len(used) + 1 < dom.at_least):
                ids = [_legal(words, tok.quoted)]  # inside an escape, or the values may run out
            else:
                # a closer matters only where it completes a used item: after it comes layout,
                # the array's end or an item with fresh values left
                ids = [_legal(words, tok.unclosing)]
                for k in used:
                    if k[0] == "s" and k[1].startswith(done) and k[1][len(done):] in tok.closers:
                        ids.append(_legal(words, tok.closers[k[1][len(done):]]))
            if not dom.open_strings:
                if item[1][2]:
                    ids.append(_legal(words, self._extending(used, done)))
                else:  # a token adding content no used item goes on with leaves it settled
                    ids.append(_legal(words, self._extending(used, done, tok.escaped)))
            return np.unique(np.concatenate(ids)).tolist()
        if self.fast:
            ids = _set_ids(words, self.domain.size)
        else:
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:self.domain.size]
            ids = np.flatnonzero(bits)
        if item is not None and item[0] == "s":
            keep = tok.quotes[ids] > 0
            if not dom.open_strings:
                keep |= np.isin(ids, self._extending(used, item[1][1]))
            return ids[keep].tolist()
        if item is not None:  # an open scalar: whitespace ends it too
            return ids.tolist()
        keep = ~tok.space[ids]
        if dom.open_strings:
            keep &= ~tok.opens[ids]
        return ids[keep].tolist()

    def _extending(self, used: frozenset, done: bytes, escaped: dict | None = None) -> np.ndarray:
        # The tokens that carry an open string's content `done` on along a used item (each a
        # prefix of the rest of one), and those holding an escape: every one, or, given
        # `escaped` (outside an escape), those whose unescaped content is such a prefix.
        extend = set()
        for k in used:
            if k[0] == "s" and k[1].startswith(done):
                rest = k[1][len(done):]
                for n in range(1, len(rest) + 1):
                    extend.update(self._exact.get(rest[:n], ()))
                if escaped is not None:
                    for n in range(len(rest) + 1):
                        extend.update(escaped.get(rest[:n], ()))
        if escaped is not None:
            extend.update(escaped.get(None, ()))
            return np.fromiter(extend, dtype=np.int64)
        return np.union1d(np.fromiter(extend, dtype=np.int64),
                          JsonNameIndex.of(self.domain).escapes)


__all__ = ["ItemScan"]
