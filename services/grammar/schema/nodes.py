"""The reduced schema graph: immutable, hashable nodes that the reduction builds and the emitter
reads.

A node is the exact set of JSON values it accepts. Typed nodes hold only assertions of one JSON
type; compositions are already reduced (allOf intersected, oneOf proved exclusive and turned into a
union); `$ref` stays a `Ref` into `ReducedSchema.defs`, so recursion stays a graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union as _U

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class AnyValue:
    """Every JSON value (the empty schema, `true`)."""


@dataclass(frozen=True)
class NoValue:
    """No JSON value (`false`, an empty intersection)."""


ANY = AnyValue()
NEVER = NoValue()


@dataclass(frozen=True)
class Ref:
    """A reference to `ReducedSchema.defs[name]` (a source `$ref` or a memoized intersection)."""

    name: str


@dataclass(frozen=True)
class Literals:
    """A finite value set (const/enum); `texts` are order-preserving JSON texts of the values."""

    texts: tuple[str, ...]


@dataclass(frozen=True)
class NullType:
    pass


@dataclass(frozen=True)
class BooleanType:
    pass


@dataclass(frozen=True)
class IntegerType:
    """Integers in [lo, hi], both inclusive, always inside signed 64-bit."""

    lo: int = INT64_MIN
    hi: int = INT64_MAX
    multiple: int = 1  # multipleOf (a positive integer)


@dataclass(frozen=True)
class NumberType:
    """Numbers (integers included) with exact bounds as written in the schema; None = unbounded."""

    lo: Fraction | None = None
    lo_exclusive: bool = False
    hi: Fraction | None = None
    hi_exclusive: bool = False


@dataclass(frozen=True)
class Pattern:
    source: str  # the schema's pattern text (search semantics), or a format's regex (whole match)
    pointer: str  # where it was written
    whole: bool = False  # True: the whole string must match (a `format`); False: search (`pattern`)
    negated: bool = False  # True: the string must NOT match (from `not`)
    literal: bool = (
        False  # True: `source` is one literal string (whole match), from `not` of a const
    )
    fmt: str = ""  # the format's name, for a `format`


@dataclass(frozen=True)
class StringType:
    """Strings whose length in Unicode scalar values lies in [min_length, max_length]."""

    min_length: int = 0
    max_length: int | None = None
    patterns: tuple[Pattern, ...] = ()


@dataclass(frozen=True)
class ArrayType:
    """Position i < len(prefix) follows prefix[i], later ones `items`; length in [min, max]."""

    prefix: tuple["Node", ...] = ()
    items: "Node" = ANY
    min_items: int = 0
    max_items: int | None = None
    unique: bool = False  # uniqueItems (finite domains: arrays.py; other scalars: unique_items.py)
    contains: "Node | None" = None  # contains: at least one item also satisfies this (no prefix)


@dataclass(frozen=True)
class Required:
    name: str
    pointer: str  # where the name was listed


@dataclass(frozen=True)
class ObjectType:
    """Declared properties in generation order, required names, the rule for every other name."""

    properties: tuple[tuple[str, "Node"], ...] = ()
    required: tuple[Required, ...] = ()
    additional: "Node" = ANY  # names neither declared nor matched by a pattern
    # patternProperties: (pattern, schema) for undeclared names (declared values already include
    # the patterns their name matches); see Graph.value_of
    patterns: tuple[tuple[Pattern, "Node"], ...] = ()
    names: "Node" = ANY  # propertyNames: ANY, a StringType or string Literals
    min_props: int = 0
    max_props: int | None = None

    def value_of(self, name: str) -> "Node":
        """The declared value, else `additional` (objects without patterns or names only)."""
        for key, node in self.properties:
            if key == name:
                return node
        return self.additional

    @property
    def extended(self) -> bool:
        """Uses patternProperties, propertyNames or a property count."""
        return bool(self.patterns) or self.names != ANY or self.min_props > 0 or \
            self.max_props is not None

    @property
    def required_names(self) -> frozenset[str]:
        return frozenset(r.name for r in self.required)


@dataclass(frozen=True)
class Union:
    """Any of the branches (anyOf, a proved oneOf, a type array). Never nested, never empty."""

    branches: tuple["Node", ...]


Typed = _U[NullType, BooleanType, IntegerType, NumberType, StringType, ArrayType, ObjectType]
Node = _U[AnyValue, NoValue, Ref, Literals, Typed, Union]

TYPE_NAMES = ("null", "boolean", "integer", "number", "string", "array", "object")
# Per JSON type ("integer" is part of "number"), the node of every value of that type.
FULL_TYPES: dict[str, "Node"] = {
    "null": NullType(),
    "boolean": BooleanType(),
    "number": NumberType(),
    "string": StringType(),
    "array": ArrayType(),
    "object": ObjectType(),
}


@dataclass
class ReducedSchema:
    """The result of `check_schema`: the root node and every definition it reaches."""

    root: Node
    defs: dict[str, Node] = field(default_factory=dict)
    # Keywords in no vocabulary of the dialect, read as annotations (sorted names).
    annotations: tuple[str, ...] = ()


def make_union(branches: list[Node] | tuple[Node, ...]) -> Node:
    """Flatten, drop NEVER, collapse to ANY / a single branch; keeps first-seen order."""
    out: list[Node] = []
    for b in branches:
        parts = b.branches if isinstance(b, Union) else (b,)
        for p in parts:
            if p is NEVER or isinstance(p, NoValue):
                continue
            if isinstance(p, AnyValue):
                return ANY
            if p not in out:
                out.append(p)
    if not out:
        return NEVER
    if len(out) == 1:
        return out[0]
    return Union(tuple(out))
