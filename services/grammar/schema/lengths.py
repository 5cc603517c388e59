"""The bounded strings of a content schema whose length a companion counts beside the matcher.

On llguidance a mask in the last characters of a `maxLength` string costs milliseconds on a large
vocabulary (docs/benchmarks.md, "Masks near the end of a bounded string"); an unbounded string
plus one packed row per count left costs microseconds. The companion
(services/grammar/json_lengths.py) knows which bound applies only from the string's place in the
text, so a string is counted only where its JSON path from the root (member names of objects,
element indices of arrays) reaches exactly one schema node and that node is a plain bounded
string: the path runs through objects without patternProperties, propertyNames or property
counts and arrays without contains or uniqueItems, never through a union, a `$ref` or a literal
set, and the string has no pattern or format. Such a position holds nothing but that string, so
writing it unbounded and counting beside the matcher is the same language. Every other string
keeps its exact bounded grammar.

`counted_strings(root)` is the tree of those positions (None: none); `unbounded(root, counted)`
is the graph with each of them written without its length bounds. The emitter (content JSON,
`_emit(counted_lengths=True)`) and the worker's companion both read `counted_strings` of the same
reduction, so they agree by construction.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Union as _U

from services.grammar.schema.nodes import ArrayType, Node, NoValue, ObjectType, StringType

Bounds = tuple[int, "int | None"]  # (minLength, maxLength), characters


@dataclass(frozen=True)
class CountedObject:
    """The counted positions under an object: member name (its bytes as the grammar spells it,
    between the quotes) -> what is counted in its value."""

    members: tuple[tuple[bytes, "Counted"], ...]

    def child(self, name: bytes) -> "Counted | None":
        for key, sub in self.members:
            if key == name:
                return sub
        return None


@dataclass(frozen=True)
class CountedArray:
    """The counted positions under an array: per prefix index, then every later element."""

    prefix: tuple["Counted | None", ...]
    items: "Counted | None"

    def child(self, index: int) -> "Counted | None":
        return self.prefix[index] if index < len(self.prefix) else self.items


Counted = _U[tuple, CountedObject, CountedArray]  # a tuple is the Bounds of a counted string


def _counted(node: StringType) -> bool:
    return not node.patterns and node.max_length is not None


def name_bytes(name: str) -> bytes:
    """A member name as the grammar writes it between its quotes (canonical escapes, so one
    spelling per name)."""
    return json.dumps(name, ensure_ascii=False)[1:-1].encode("utf-8")


def counted_strings(node: Node) -> Counted | None:
    """The counted string positions under `node` (see the module docstring); None: none."""
    if isinstance(node, StringType):
        return (node.min_length, node.max_length) if _counted(node) else None
    if isinstance(node, ObjectType) and not node.extended:
        members = tuple((name_bytes(k), sub) for k, v in node.properties
                        if not isinstance(v, NoValue) and (sub := counted_strings(v)) is not None)
        return CountedObject(members) if members else None
    if isinstance(node, ArrayType) and not node.unique and node.contains is None:
        prefix = tuple(counted_strings(p) for p in node.prefix)
        items = counted_strings(node.items)
        if items is None and all(p is None for p in prefix):
            return None
        return CountedArray(prefix, items)
    return None


def unbounded(node: Node, counted: Counted | None) -> Node:
    """`node` with every counted string (of `counted_strings(node)`) written without bounds."""
    if counted is None:
        return node
    if isinstance(counted, tuple):
        assert isinstance(node, StringType)
        return StringType()
    if isinstance(counted, CountedObject):
        assert isinstance(node, ObjectType)
        props = tuple((k, unbounded(v, counted.child(name_bytes(k)))) for k, v in node.properties)
        return dataclasses.replace(node, properties=props)
    assert isinstance(node, ArrayType)
    prefix = tuple(unbounded(p, counted.child(i)) for i, p in enumerate(node.prefix))
    return dataclasses.replace(node, prefix=prefix, items=unbounded(node.items, counted.items))


def least_bounds(counted: Counted | None) -> tuple[int | None, int]:
    """(the smallest maxLength, the largest minLength) over every counted string: a token whose
    strings all fit these fits wherever it lands."""
    if counted is None:
        return None, 0
    if isinstance(counted, tuple):
        return counted[1], counted[0]
    subs = [s for _, s in counted.members] if isinstance(counted, CountedObject) else \
        [*counted.prefix, counted.items]
    his, los = [], [0]
    for s in subs:
        hi, lo = least_bounds(s)
        if hi is not None:
            his.append(hi)
        los.append(lo)
    return (min(his) if his else None), max(los)
