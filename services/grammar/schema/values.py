"""JSON values against the reduced schema's nodes: JSON equality, a value's JSON type, the types a
node can produce, a number inside a node's bounds. What the intersection (algebra.py), the oneOf
proofs (exclusive.py) and the unique-array grammar (arrays.py) share about plain values.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

from services.grammar.schema.context import MAX_DEPTH
from services.grammar.schema.nodes import (
    AnyValue,
    ArrayType,
    BooleanType,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NullType,
    NumberType,
    ObjectType,
    Ref,
    StringType,
    Union,
)


def json_equal(a: Any, b: Any) -> bool:
    """JSON value equality (1 == 1.0, but true != 1; member order does not matter)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def type_domain(node: Node, graph: Any, depth: int = 0) -> frozenset[str]:
    """The JSON types a node can produce ("integer" and "number" both mean numbers); `graph`:
    the Graph (algebra.py) whose `defs` resolve references."""
    if depth > MAX_DEPTH:
        return frozenset({"null", "boolean", "number", "string", "array", "object"})
    if isinstance(node, AnyValue):
        return frozenset({"null", "boolean", "number", "string", "array", "object"})
    if isinstance(node, NoValue):
        return frozenset()
    if isinstance(node, Ref):
        return type_domain(graph.defs[node.name], graph, depth + 1)
    if isinstance(node, Union):
        return frozenset().union(*(type_domain(b, graph, depth + 1) for b in node.branches))
    if isinstance(node, Literals):
        return frozenset(value_type(json.loads(t)) for t in node.texts)
    return frozenset({{NullType: "null", BooleanType: "boolean", IntegerType: "number",
                       NumberType: "number", StringType: "string", ArrayType: "array",
                       ObjectType: "object"}[type(node)]})


def value_type(v: Any) -> str:
    """The JSON type of a value ("number" for integers too)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def in_bounds(n: NumberType, v: Fraction) -> bool:
    """Whether `v` lies within the number node's bounds (its exclusivity included)."""
    if n.lo is not None and (v < n.lo or (n.lo_exclusive and v == n.lo)):
        return False
    return not (n.hi is not None and (v > n.hi or (n.hi_exclusive and v == n.hi)))
