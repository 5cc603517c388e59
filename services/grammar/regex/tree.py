"""The expression tree shared by the regex and GBNF converters, and its two writers:
xgrammar EBNF (`to_ebnf`) and explicit regex text for xgrammar's regex converter (`to_regex`).

Both writers use only constructs whose language was checked against xgrammar 0.2.8 (string
literals with \\u / \\U escapes, positive classes of explicit ranges, groups, `|`, `*`, `+`, `?`,
`{m}`, `{m,}`, `{m,n}`); the tests enumerate the languages they produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from services.grammar.regex.charset import CharSet, ebnf_class, regex_char, regex_class


@dataclass(frozen=True)
class Chars:
    """Exactly one character from `charset`."""

    charset: CharSet


@dataclass(frozen=True)
class Literal:
    """The exact text (may be empty)."""

    text: str


@dataclass(frozen=True)
class Seq:
    items: tuple["Node", ...]  # empty: the empty string


@dataclass(frozen=True)
class Alt:
    items: tuple["Node", ...]  # at least two


@dataclass(frozen=True)
class Repeat:
    item: "Node"
    lo: int
    hi: int | None  # None: unbounded


@dataclass(frozen=True)
class Ref:
    """A reference to a grammar rule (GBNF only), already renamed for xgrammar."""

    name: str


@dataclass(frozen=True)
class Tokens:
    """One token: one of `ids` (`Token(...)`), or any token except `ids` (`ExcludeToken(...)`)."""

    ids: tuple[int, ...]
    exclude: bool


Node = Union[Chars, Literal, Seq, Alt, Repeat, Ref, Tokens]


def seq(items: list[Node]) -> Node:
    """A sequence, flattened: nested sequences spliced in, a single item returned as itself."""
    flat: list[Node] = []
    for item in items:
        flat.extend(item.items if isinstance(item, Seq) else (item,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(items: list[Node]) -> Node:
    return items[0] if len(items) == 1 else Alt(tuple(items))


# ---- EBNF -------------------------------------------------------------------------------------


def ebnf_literal(text: str) -> str:
    """A string literal matching `text` exactly; every non-printable or non-ASCII char escaped."""
    out = ['"']
    for ch in text:
        cp = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= cp < 0x7F:
            out.append(ch)
        elif cp <= 0xFFFF:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


def quantifier(lo: int, hi: int | None) -> str:
    """The repetition suffix {lo,hi} in the spelling EBNF, regex and Lark share (*, +, ?)."""
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return f"{{{lo},}}"
    if lo == hi:
        return f"{{{lo}}}"
    return f"{{{lo},{hi}}}"


def to_ebnf(node: Node) -> str:
    """The EBNF expression (a rule body) for `node`."""
    if isinstance(node, Literal):
        return ebnf_literal(node.text)
    if isinstance(node, Chars):
        single = node.charset.single
        return ebnf_literal(chr(single)) if single is not None else ebnf_class(node.charset)
    if isinstance(node, Seq):
        if not node.items:
            return '""'
        return " ".join(_ebnf_atom(item) if isinstance(item, Alt) else to_ebnf(item)
                        for item in node.items)
    if isinstance(node, Alt):
        return " | ".join(to_ebnf(item) for item in node.items)
    if isinstance(node, Repeat):
        return _ebnf_atom(node.item) + quantifier(node.lo, node.hi)
    if isinstance(node, Ref):
        return node.name
    if isinstance(node, Tokens):
        return ("ExcludeToken(" if node.exclude else "Token(") + ", ".join(map(str, node.ids)) + ")"
    raise TypeError(f"not a tree node: {node!r}")


def _ebnf_atom(node: Node) -> str:
    return "(" + to_ebnf(node) + ")"


# ---- explicit regex ---------------------------------------------------------------------------


def to_regex(node: Node) -> str:
    """Regex text with the same whole-match language, for xgrammar's own regex converter."""
    if isinstance(node, Literal):
        return "".join(regex_char(ord(c)) for c in node.text) if node.text else "()"
    if isinstance(node, Chars):
        single = node.charset.single
        return regex_char(single) if single is not None else regex_class(node.charset)
    if isinstance(node, Seq):
        if not node.items:
            return "()"
        return "".join("(" + to_regex(item) + ")" if isinstance(item, Alt) else to_regex(item)
                       for item in node.items)
    if isinstance(node, Alt):
        return "|".join(to_regex(item) for item in node.items)
    if isinstance(node, Repeat):
        return "(" + to_regex(node.item) + ")" + quantifier(node.lo, node.hi)
    raise TypeError(f"{type(node).__name__} has no regex form")
