"""uniqueItems over an infinite (or large) item domain, kept by a matcher-side companion
(services/grammar/unique_items.py): which arrays of a JSON text it keeps unique, and what it
must know of their items to keep the mask exact.

A context-free grammar cannot exclude the items an array used earlier, so such an array is
emitted as a plain array and the companion, which reads the generated text, clears every token
that would complete a repeated item or leave only used items to complete. That is exact for item
domains whose values are scalars (strings, integers, booleans, null, scalar const/enum values),
since a scalar item is decided at one position of the text and no unique array nests in another:

- `ItemDomain`: per companion array, whether some part of its items is every string of at least
  some length (then every string prefix has unboundedly many completions: no string dead-ends),
  a lower bound of its distinct values (minItems must not exceed it: the array could otherwise run
  out of distinct values below the minimum, a dead end the companion could not see at the next
  item), and the spellings the grammar writes for its non-string literals;
- `Positions`: the schema nodes a value at a text position can belong to, followed by member
  names and item indexes (the text never says which union branch it is in). Each array position
  must be either companion-unique in every node it can belong to or in none; where the branches
  disagree (`anyOf` of a unique and a non-unique array of strings), the value set would need
  the branch the generation is in, and the schema is refused at the uniqueItems pointer.

Undeclared member names take every patternProperties schema and additionalProperties at once (a
superset of the nodes: at worst a refusal, never a wrong mark, since a node the text cannot be in
generates nothing there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.grammar.schema.nodes import (
    AnyValue,
    ArrayType,
    BooleanType,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NullType,
    ObjectType,
    Ref,
    StringType,
    Union,
)

MAX_POSITIONS = 4096  # position sets a schema may have before it is refused
INFINITE = 1 << 62  # the distinct values of an open string part


@dataclass(frozen=True)
class ItemDomain:
    """What the companion needs of a companion array's items (see the module docstring)."""

    open_strings: bool
    at_least: int
    literals: tuple[tuple[str, Any], ...] = ()  # (grammar spelling, value) of non-string literals
    strings: bool = True  # some part holds strings
    # A finite domain's values (the companion's keys, strings as UTF-8), else None; the lengths
    # of a domain that is exactly the strings of [min, max] code points (no pattern), else None;
    # (lo, hi, multiple) of one that is exactly the integers of [lo, hi] of a multiple, else None.
    values: frozenset | None = None
    lengths: tuple[int, int] | None = None
    integers: tuple[int, int, int] | None = None

    def meet(self, other: "ItemDomain") -> "ItemDomain":
        """What holds whichever of two companion arrays the generation is in."""
        return ItemDomain(self.open_strings and other.open_strings,
                          min(self.at_least, other.at_least),
                          tuple(dict.fromkeys(self.literals + other.literals)),
                          self.strings or other.strings,
                          self.values if self.values == other.values else None,
                          self.lengths if self.lengths == other.lengths else None,
                          self.integers if self.integers == other.integers else None)


def _parts(graph: Any, node: Node, depth: int = 0) -> list[Node] | None:
    if depth > 64:
        return None
    if isinstance(node, Ref):
        return _parts(graph, graph.defs[node.name], depth + 1)
    if isinstance(node, Union):
        out: list[Node] = []
        for b in node.branches:
            part = _parts(graph, b, depth + 1)
            if part is None:
                return None
            out += part
        return out
    return [node]


def item_domain(graph: Any, items: Node) -> ItemDomain | None:
    """The ItemDomain of a companion array's items, or None where they are not scalars the
    companion decides exactly (numbers with fractions, arrays, objects, any value)."""
    parts = _parts(graph, items)
    if parts is None:
        return None
    open_strings = strings = False
    at_least = 0
    literals: list[tuple[str, Any]] = []
    finite: list[Any] = []
    for p in parts:
        if isinstance(p, NoValue):
            continue
        if isinstance(p, StringType):
            strings = True
            if not p.patterns and p.max_length is None:
                open_strings = True
                at_least = INFINITE
            elif not p.patterns:  # at least the 95 printable ASCII characters at each length
                at_least = max(at_least, min(INFINITE, sum(95 ** n for n in range(
                    p.min_length, min(p.max_length, p.min_length + 12) + 1))))
            at_least = max(at_least, 1)
        elif isinstance(p, Literals):
            for t in p.texts:
                v = json.loads(t)
                if isinstance(v, (list, dict)):
                    return None
                if isinstance(v, str):
                    strings = True
                else:
                    literals.append((json.dumps(v), v))
                finite.append(v)
        elif isinstance(p, NullType):
            literals.append(("null", None))
            finite.append(None)
        elif isinstance(p, BooleanType):
            literals += [("true", True), ("false", False)]
            finite += [True, False]
        elif isinstance(p, IntegerType):
            count = p.hi // p.multiple - -(-p.lo // p.multiple) + 1
            at_least = max(at_least, count)
        else:
            return None
    distinct = {_key(v) for v in finite}
    real = [p for p in parts if not isinstance(p, NoValue)]
    bounded = len(real) == 1 and isinstance(real[0], StringType) and not real[0].patterns and \
        real[0].max_length is not None
    values = None if any(isinstance(p, (StringType, IntegerType)) for p in real) else frozenset(
        ("s", k[1].encode("utf-8", "surrogatepass")) if k[0] == "s" else k for k in distinct)
    one = real[0] if len(real) == 1 else None
    return ItemDomain(open_strings, max(at_least, len(distinct)), tuple(dict.fromkeys(literals)),
                      strings, values,
                      (one.min_length, one.max_length) if bounded else None,
                      (one.lo, one.hi, one.multiple) if isinstance(one, IntegerType) else None)


def _key(v: Any) -> tuple:
    """A scalar's identity under JSON equality (1 == 1.0, true != 1)."""
    if v is None:
        return ("z",)
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, str):
        return ("s", v)
    return ("n", v)


def companion_array(graph: Any, node: ArrayType) -> bool:
    """Whether the companion keeps `node` unique (uniqueItems whose items the grammar's finite
    unique-array form does not cover: schema/arrays.py `finite_domain`)."""
    from services.grammar.schema.arrays import finite_domain

    return node.unique and finite_domain(graph, node.items, "") is None


class Mixed(Exception):
    """An array position where some node is companion-unique and another is not."""


class Positions:
    """The schema nodes a value at a text position belongs to (a frozenset of ArrayType,
    ObjectType and AnyValue nodes: scalars have no positions below them), memoized."""

    def __init__(self, graph: Any, root: Node) -> None:
        self.graph = graph
        self._members: dict[tuple, frozenset] = {}
        self._items: dict[tuple, frozenset] = {}
        self._arrays: dict[frozenset, ItemDomain | None] = {}
        self.root = self.of([root])

    def of(self, nodes: list[Node]) -> frozenset:
        out: set[Node] = set()
        for n in nodes:
            for p in _parts(self.graph, n) or [AnyValue()]:
                if isinstance(p, (ArrayType, ObjectType, AnyValue)):
                    out.add(p)
        return frozenset(out)

    def declared(self, pos: frozenset) -> set[str]:
        return {k for n in pos if isinstance(n, ObjectType) for k, _ in n.properties}

    def member(self, pos: frozenset, name: str | None) -> frozenset:
        """The position of the value of member `name` (None: a name no node declares)."""
        key = (pos, name)
        if key not in self._members:
            nodes: list[Node] = []
            for n in pos:
                if isinstance(n, AnyValue):
                    nodes.append(n)
                elif isinstance(n, ObjectType):
                    declared = dict(n.properties)
                    if name is not None and name in declared:
                        nodes.append(declared[name])
                    else:
                        nodes.append(n.additional)
                        nodes += [v for _, v in n.patterns]
            self._members[key] = self.of(nodes)
        return self._members[key]

    def item(self, pos: frozenset, index: int) -> frozenset:
        width = max([len(n.prefix) for n in pos if isinstance(n, ArrayType)] + [0])
        key = (pos, min(index, width))
        if key not in self._items:
            nodes: list[Node] = []
            for n in pos:
                if isinstance(n, AnyValue):
                    nodes.append(n)
                elif isinstance(n, ArrayType):
                    nodes.append(n.prefix[index] if index < len(n.prefix) else n.items)
                    if n.contains is not None:
                        nodes.append(n.contains)
            self._items[key] = self.of(nodes)
        return self._items[key]

    def array(self, pos: frozenset) -> ItemDomain | None:
        """The ItemDomain of the companion arrays at `pos`, None where no array there is one;
        raises Mixed where some are and some are not, ValueError where one's items are outside
        the companion's domains."""
        if pos not in self._arrays:
            arrays = [n for n in pos if isinstance(n, (ArrayType, AnyValue))]
            unique = [n for n in arrays if isinstance(n, ArrayType) and
                      companion_array(self.graph, n)]
            if unique and len(unique) < len(arrays):
                raise Mixed
            out: ItemDomain | None = None
            for n in unique:
                d = item_domain(self.graph, n.items)
                if d is None or n.prefix or n.contains is not None or d.at_least < n.min_items:
                    raise ValueError
                out = d if out is None else out.meet(d)
            self._arrays[pos] = out
        return self._arrays[pos]


def check_positions(graph: Any, root: Node, ctx: Any, pointer: str) -> None:
    """Refuse (UnsupportedSchema at `pointer`, the first companion array's uniqueItems) a schema
    where some array position is companion-unique in one node and not in another, or has more
    than MAX_POSITIONS positions."""
    positions = Positions(graph, root)
    seen = {positions.root}
    todo = [positions.root]
    while todo:
        pos = todo.pop()
        try:
            positions.array(pos)
        except Mixed:
            raise ctx.unsupported(pointer, "uniqueItems over an infinite item domain where the "
                                           "same array position is also a non-unique array "
                                           "(anyOf/oneOf/patternProperties branches): which one "
                                           "the generation is in is not known") from None
        except ValueError:
            raise ctx.unsupported(pointer, "uniqueItems over an infinite item domain is supported "
                                           "for scalar items (strings, integers, booleans, null, "
                                           "scalar enum/const values) without prefixItems or "
                                           "contains, and minItems within the distinct values "
                                           "provable") from None
        nxt = [positions.member(pos, k) for k in positions.declared(pos)]
        nxt.append(positions.member(pos, None))
        width = max([len(n.prefix) for n in pos if isinstance(n, ArrayType)] + [0])
        nxt += [positions.item(pos, i) for i in range(width + 1)]
        for p in nxt:
            if p and p not in seen:
                seen.add(p)
                todo.append(p)
                if len(seen) > MAX_POSITIONS:
                    raise ctx.unsupported(pointer, f"uniqueItems: the schema has more than "
                                                   f"{MAX_POSITIONS} value positions to classify")


__all__ = ["INFINITE", "ItemDomain", "Positions", "check_positions", "companion_array",
           "item_domain"]
