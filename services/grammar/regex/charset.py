"""Sets of Unicode characters as sorted inclusive code-point ranges, and the ECMAScript classes.

Every set a converter emits is a set of Unicode scalar values: surrogate code points
(U+D800..U+DFFF) are never members, because xgrammar would otherwise match their (invalid) UTF-8
encodings, e.g. its negated class `[^a]` accepts the bytes ED A0 80.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

MAX_CODE_POINT = 0x10FFFF
SURROGATE_LO, SURROGATE_HI = 0xD800, 0xDFFF


@dataclass(frozen=True)
class CharSet:
    """A set of code points: `ranges` are sorted, disjoint, non-adjacent and inclusive."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> "CharSet":
        """Normalise any iterable of inclusive (lo, hi) pairs (overlaps and adjacency merged)."""
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if lo > hi:
                raise ValueError(f"range {lo:#x}-{hi:#x} is reversed")
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return cls(tuple((lo, hi) for lo, hi in merged))

    @classmethod
    def chars(cls, text: str) -> "CharSet":
        return cls.of((ord(c), ord(c)) for c in text)

    def union(self, other: "CharSet") -> "CharSet":
        return CharSet.of(self.ranges + other.ranges)

    def invert(self) -> "CharSet":
        """All scalar values not in this set."""
        out: list[tuple[int, int]] = []
        nxt = 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CODE_POINT:
            out.append((nxt, MAX_CODE_POINT))
        return CharSet(tuple(out)).scalars()

    def scalars(self) -> "CharSet":
        """This set without the surrogate code points."""
        out: list[tuple[int, int]] = []
        for lo, hi in self.ranges:
            if hi < SURROGATE_LO or lo > SURROGATE_HI:
                out.append((lo, hi))
                continue
            if lo < SURROGATE_LO:
                out.append((lo, SURROGATE_LO - 1))
            if hi > SURROGATE_HI:
                out.append((SURROGATE_HI + 1, hi))
        return CharSet(tuple(out))

    def __contains__(self, cp: int) -> bool:
        i = bisect_right(self.ranges, (cp, MAX_CODE_POINT + 1)) - 1  # the last range from <= cp
        return i >= 0 and cp <= self.ranges[i][1]

    @property
    def single(self) -> int | None:
        """The one member of a one-character set, else None."""
        if len(self.ranges) == 1 and self.ranges[0][0] == self.ranges[0][1]:
            return self.ranges[0][0]
        return None


EMPTY = CharSet()
ANY = CharSet.of([(0, MAX_CODE_POINT)]).scalars()  # every scalar value, newlines included
DIGIT = CharSet.of([(0x30, 0x39)])  # ECMAScript \d: ASCII only
WORD = CharSet.of([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])  # \w: ASCII only
LINE_TERMINATORS = CharSet.of([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
# ECMAScript \s = WhiteSpace (TAB VT FF SP NBSP ZWNBSP and category Zs) + LineTerminator.
SPACE = CharSet.of(
    [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
     (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
)
DOT = LINE_TERMINATORS.invert()  # ECMAScript `.` without the s flag


def _ebnf_char(cp: int) -> str:
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def ebnf_class(cs: CharSet) -> str:
    """An xgrammar EBNF element matching exactly one character of `cs` (every char escaped)."""
    if not cs.ranges:
        # Nothing matches: the complement of every code point.
        return f"[^{_ebnf_char(0)}-{_ebnf_char(MAX_CODE_POINT)}]"
    parts = [_ebnf_char(lo) if lo == hi else f"{_ebnf_char(lo)}-{_ebnf_char(hi)}"
             for lo, hi in cs.ranges]
    return "[" + "".join(parts) + "]"


_REGEX_SYNTAX = set("^$\\.*+?()[]{}|")


def regex_char(cp: int, *, in_class: bool = False) -> str:
    """One character in the explicit regex form xgrammar's regex converter reads literally:
    ASCII letters and digits raw; outside a class, syntax characters backslash-escaped and other
    printable ASCII raw; any other BMP character (and everything inside a class) as \\uXXXX;
    characters outside the BMP written directly (the converter reads code points, not UTF-16)."""
    ch = chr(cp)
    if ch.isascii() and ch.isalnum():
        return ch
    if not in_class and ch in _REGEX_SYNTAX:
        return "\\" + ch
    if not in_class and 0x20 <= cp < 0x7F:
        return ch
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return ch


def regex_class(cs: CharSet) -> str:
    """An explicit positive regex class for `cs` (never `[^...]`, `.`, `\\s`: xgrammar reads those
    with its own, different sets)."""
    if not cs.ranges:
        return f"[^{regex_char(0, in_class=True)}-{chr(MAX_CODE_POINT)}]"
    parts = [regex_char(lo, in_class=True) if lo == hi
             else f"{regex_char(lo, in_class=True)}-{regex_char(hi, in_class=True)}"
             for lo, hi in cs.ranges]
    return "[" + "".join(parts) + "]"

# Python's `re` (str patterns, no flags), the reading of the validators users run: `.` excludes
# only \n; \d \w \s are read from sre itself over every scalar value of the running
# interpreter's Unicode database (so they are the validators' own).
PY_DOT = CharSet.of([(0x0A, 0x0A)]).invert()


def python_class(letter: str) -> CharSet:
    """Python's `\\d`, `\\w` or `\\s` (letter "d", "w" or "s") over the Unicode scalar values."""
    return _python_classes()[letter]


@lru_cache(maxsize=1)
def _python_classes() -> dict[str, CharSet]:
    text = "".join(map(chr, range(SURROGATE_LO))) + \
        "".join(map(chr, range(SURROGATE_HI + 1, MAX_CODE_POINT + 1)))
    gap = SURROGATE_HI - SURROGATE_LO + 1  # text index i >= SURROGATE_LO is code point i + gap
    out = {}
    for letter in "dws":
        runs = [tuple(i + gap if i >= SURROGATE_LO else i for i in (m.start(), m.end() - 1))
                for m in re.finditer(f"\\{letter}+", text)]
        out[letter] = CharSet.of(_split_gap(runs))
    return out


def _split_gap(ranges: list) -> list:
    out = []
    for lo, hi in ranges:
        if lo < SURROGATE_LO <= hi:
            out += [(lo, SURROGATE_LO - 1), (SURROGATE_HI + 1, hi)]
        else:
            out.append((lo, hi))
    return out
