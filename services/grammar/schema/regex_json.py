"""JSON Schema `pattern` as a JSON string grammar, and the same language as a Python-side matcher.

The regex tree (`services.grammar.regex.search_tree`: search semantics, unanchored unless ^ / $) is
a language over decoded characters. A JSON string writes each character as one canonical unit
(`strings.unit`: '"' and '\\' and the controls escaped, everything else raw), and that code is
injective and prefix-free, so replacing every character of the tree by its unit gives exactly the
canonical encodings of the matching strings. A class is split into its raw part (minus '"', '\\'
and U+0000..U+001F) and alternatives for its escaped members.

`whole_matches` decides the same language on a decoded value (for const/enum filtering) by partial
derivatives over the tree: linear in the tree for each character, never backtracking.
"""

from __future__ import annotations

from functools import lru_cache

from services.grammar.regex.charset import CharSet
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
)
from services.grammar.schema.strings import unit

# Characters a JSON string must escape: '"', '\\' and the C0 controls.
_ESCAPED = CharSet.of([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
_RAW = _ESCAPED.invert()  # every scalar value a JSON string writes raw


def _intersect(a: CharSet, b: CharSet) -> CharSet:
    out: list[tuple[int, int]] = []
    for lo, hi in a.ranges:
        for blo, bhi in b.ranges:
            if blo <= hi and bhi >= lo:
                out.append((max(lo, blo), min(hi, bhi)))
    return CharSet.of(out)


def _escaped_members(cs: CharSet) -> list[str]:
    """The members of `cs` that JSON escapes, as characters, in code-point order."""
    return [chr(cp) for lo, hi in _intersect(cs, _ESCAPED).ranges for cp in range(lo, hi + 1)]


def _escape_tree(chars: list[str]) -> Node | None:
    """Canonical units of `chars` (all escaped ones), grouped by shared prefix: `\\x` short forms
    as one class, `\\u00XY` as `\\u00` followed by a class per X."""
    short, long_by_digit = [], {}
    for ch in chars:
        u = unit(ch)
        assert u.startswith("\\") and len(u) in (2, 6), u
        if len(u) == 2:
            short.append(u[1])
        else:
            long_by_digit.setdefault(u[4], []).append(u[5])
    items: list[Node] = []
    if short:
        items.append(seq([Literal("\\"), Chars(CharSet.chars("".join(short)))]))
    if long_by_digit:
        tails = [seq([Literal(x), Chars(CharSet.chars("".join(ys)))])
                 for x, ys in sorted(long_by_digit.items())]
        items.append(seq([Literal("\\u00"), alt(tails)]))
    return alt(items) if items else None


def _lower_chars(cs: CharSet) -> Node | None:
    raw = _intersect(cs, _RAW)
    escaped = _escape_tree(_escaped_members(cs))
    if escaped is None:
        return Chars(raw) if raw.ranges else None
    return escaped if not raw.ranges else alt([Chars(raw), escaped])


def lower(node: Node) -> Node | None:
    """The tree of canonical JSON string bodies (no quotes) of the strings `node` matches, or None
    when it matches no string. Parts that match nothing are pruned (an empty class inside an
    alternative would otherwise leave a prefix that a generation can enter and never finish)."""
    if isinstance(node, Chars):
        return _lower_chars(node.charset)
    if isinstance(node, Literal):
        return Literal("".join(unit(ch) for ch in node.text))
    if isinstance(node, Seq):
        items = [lower(item) for item in node.items]
        return None if any(i is None for i in items) else Seq(tuple(items))
    if isinstance(node, Alt):
        branches = [b for b in (lower(item) for item in node.items) if b is not None]
        return alt(branches) if branches else None
    if isinstance(node, Repeat):
        item = lower(node.item)
        if item is None:
            return Seq(()) if node.lo == 0 else None
        return Repeat(item, node.lo, node.hi)
    raise TypeError(f"{type(node).__name__} is not a regex tree node")


def json_string_ebnf(tree: Node) -> str | None:
    """An EBNF expression for the JSON strings (quotes included) whose decoded value is in the
    whole-match language of `tree`, each character in its canonical escape form; None when that
    language is empty."""
    body = lower(tree)
    return None if body is None else to_ebnf(Seq((Literal('"'), body, Literal('"'))))


# ---- matching decoded values ------------------------------------------------------------------

Residual = tuple[Node, ...]  # a sequence of nodes still to match, in order


@lru_cache(maxsize=4096)
def _nullable(node: Node) -> bool:
    if isinstance(node, Chars):
        return False
    if isinstance(node, Literal):
        return node.text == ""
    if isinstance(node, Seq):
        return all(_nullable(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_nullable(i) for i in node.items)
    if isinstance(node, Repeat):
        return node.lo == 0 or node.hi == 0 or _nullable(node.item)
    raise TypeError(f"{type(node).__name__} is not a regex tree node")


def _derive_seq(items: Residual, cp: int) -> set[Residual]:
    """Residuals of the sequence `items` after consuming the character `cp`."""
    out: set[Residual] = set()
    for i, head in enumerate(items):
        rest = items[i + 1:]
        out.update(r + rest for r in _derive(head, cp))
        if not _nullable(head):
            break
    return out


def _derive(node: Node, cp: int) -> set[Residual]:
    """Residuals of `node` alone after it consumes `cp` (the consumed character is inside it)."""
    if isinstance(node, Chars):
        return {()} if cp in node.charset else set()
    if isinstance(node, Literal):
        if node.text and ord(node.text[0]) == cp:
            return {(Literal(node.text[1:]),) if len(node.text) > 1 else ()}
        return set()
    if isinstance(node, Seq):
        return _derive_seq(node.items, cp)
    if isinstance(node, Alt):
        return set().union(*(_derive(i, cp) for i in node.items))
    if isinstance(node, Repeat):
        if node.hi == 0:
            return set()
        # One more (character-consuming) iteration; skipped empty iterations need no count.
        after = Repeat(node.item, max(node.lo - 1, 0), None if node.hi is None else node.hi - 1)
        return {r + (after,) for r in _derive(node.item, cp)}
    raise TypeError(f"{type(node).__name__} is not a regex tree node")


def whole_matches(tree: Node, value: str) -> bool:
    """True when `value` is in the whole-match language of `tree` (no backtracking: the set of
    residuals after each character is deduplicated)."""
    states: set[Residual] = {(tree,)}
    for ch in value:
        cp = ord(ch)
        states = set().union(*(_derive_seq(s, cp) for s in states)) if states else set()
        if not states:
            return False
    return any(all(_nullable(n) for n in s) for s in states)


__all__ = ["json_string_ebnf", "lower", "whole_matches"]
