"""Regular expressions for the regex constraint (whole-content match) and for JSON Schema
`pattern` (search semantics), parsed by our own ECMAScript-style parser (`parser.py`).

xgrammar's own regex converter reads `.`, `\\s` and negated classes with sets that differ from
ECMAScript's (its `.` admits newlines and surrogates, its `\\s` lacks most Unicode spaces) and
silently drops misplaced `^`/`$`; we therefore never hand it user text: `regex_to_ebnf` writes EBNF
directly, and `normalize_regex` returns an equivalent regex built only from explicit constructs.
"""

from __future__ import annotations

from services.grammar.regex.charset import ANY, CharSet
from services.grammar.regex.parser import Branch, parse_regex
from services.grammar.regex.tree import (
    Alt,
    Chars,
    Literal,
    Node,
    Repeat,
    Seq,
    alt,
    seq,
    to_ebnf,
    to_regex,
)

_ANY_STRING = Repeat(Chars(ANY), 0, None)


def _whole_match_tree(pattern: str) -> Node:
    return alt([b.node for b in parse_regex(pattern)])


_FINAL_NEWLINE = Repeat(Literal("\n"), 0, 1)


def _search_tree(branches: list[Branch], python: bool = False) -> Node:
    """Strings that contain a match: unanchored ends of each alternative take any text. `python`:
    a `$` also matches before a final newline, as in Python's `re`."""
    out: list[Node] = []
    for b in branches:
        if b.node == Seq(()) and not (b.starts_anchored or b.ends_anchored):
            out.append(_ANY_STRING)
            continue
        parts: list[Node] = [] if b.starts_anchored else [_ANY_STRING]
        parts.append(b.node)
        if not b.ends_anchored:
            parts.append(_ANY_STRING)
        elif python:
            parts.append(_FINAL_NEWLINE)
        out.append(seq(parts))
    return alt(out)


def search_tree(pattern: str, *, python: bool = False) -> Node:
    """The tree whose whole-match language is the strings in which `pattern` finds a match
    (JSON Schema `pattern`: ends unanchored unless ^ / $). Raises InvalidRegex (0-based position).
    `python=True`: the strings in which Python's `re.search` finds one (`parser.parse_regex`)."""
    return _search_tree(parse_regex(pattern, python=python, schema=True), python)


def _leafwise(a: Node, b: Node, op: str) -> Node:
    """Trees of one structure (the two readings of one pattern) with each pair of classes
    combined: "meet" (intersection) or "join" (union)."""
    if isinstance(a, Chars):
        assert isinstance(b, Chars)
        both = a.charset.union(b.charset) if op == "join" else \
            CharSet.of(r for r in _meet_ranges(a.charset, b.charset))
        return Chars(both)
    if isinstance(a, Repeat):
        return Repeat(_leafwise(a.item, b.item, op), a.lo, a.hi)
    if isinstance(a, (Seq, Alt)):
        assert type(b) is type(a) and len(a.items) == len(b.items)
        return type(a)(tuple(_leafwise(x, y, op) for x, y in zip(a.items, b.items)))
    assert a == b, (a, b)
    return a


def _meet_ranges(a: CharSet, b: CharSet) -> list[tuple[int, int]]:
    return [(max(lo, blo), min(hi, bhi)) for lo, hi in a.ranges for blo, bhi in b.ranges
            if blo <= hi and bhi >= lo]


def reading_bounds(pattern: str) -> tuple[Node, Node]:
    """Two single trees around the search languages of `pattern`'s ECMAScript and Python
    readings (`search_tree`, `python=True`): the first matches only strings both match (classes
    intersected, ECMAScript's `$`), the second every string either matches (classes united,
    Python's `$`). Raises InvalidRegex as `search_tree(..., python=True)` does."""
    ours = parse_regex(pattern, schema=True)
    theirs = parse_regex(pattern, python=True, schema=True)
    meet = [Branch(_leafwise(a.node, b.node, "meet"), a.starts_anchored, a.ends_anchored)
            for a, b in zip(ours, theirs)]
    join = [Branch(_leafwise(a.node, b.node, "join"), a.starts_anchored, a.ends_anchored)
            for a, b in zip(ours, theirs)]
    return _search_tree(meet), _search_tree(join, python=True)


def whole_tree(pattern: str) -> Node:
    """The tree of the strings `pattern` matches as a whole. Raises InvalidRegex."""
    return _whole_match_tree(pattern)


def regex_to_ebnf(pattern: str) -> str:
    """EBNF (entry rule `root`) whose language is the strings `pattern` matches as a whole.

    An empty pattern allows only the empty string. Raises InvalidRegex (0-based `position`)."""
    return "root ::= " + to_ebnf(_whole_match_tree(pattern)) + "\n"


def normalize_regex(pattern: str, *, search: bool) -> str:
    """An equivalent regex whose whole-match language xgrammar's regex converter reads literally.

    With `search=True` (JSON Schema `pattern`), the result's whole-match language is the set of
    strings in which `pattern` finds a match (ends unanchored unless ^ / $); with `search=False`
    it is the whole-match language of `pattern`. The result uses only literal characters, explicit
    positive classes, `( )`, `|`, `* + ? {m} {m,} {m,n}`. Raises InvalidRegex (0-based position)."""
    branches = parse_regex(pattern)
    tree = _search_tree(branches) if search else alt([b.node for b in branches])
    return to_regex(tree)


__all__ = ["CharSet", "normalize_regex", "reading_bounds", "regex_to_ebnf", "search_tree",
           "whole_tree"]
