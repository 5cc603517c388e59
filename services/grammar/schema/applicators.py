"""`not`, `if`/`then`/`else`, dependencies, `multipleOf`, `uniqueItems`: each where it reduces
exactly to the graph, otherwise UnsupportedSchema at its pointer.

- `not S` meets the node with the complement of S, computed where it is exact: of types, of
  finite sets of null/boolean/number/string values (numbers by the open intervals between them,
  strings by negated literal patterns), of number
  bounds, of string lengths and patterns (negated patterns go through the string automaton), of
  arrays by their lengths, `items` (some item outside: `contains` of its complement) and
  `contains` (every item outside: `items` of its complement), of objects by their required names,
  property counts, declared property schemas (an object violates S when a required name is
  missing, or a declared property is present with a value in the complement of its schema) and a
  propertyNames that excludes finitely many names (one of them is present); of unions by De
  Morgan.
- `if I then T else E` = (I and T) or (not I and E); `if` alone asserts nothing.
- `oneOf` that cannot be proved disjoint (reader.py): node and (X_i and not X_j, j != i) per i.
- `dependentRequired {a: [b]}` = objects without a, or with a and b; `dependentSchemas {a: S}` =
  objects without a, or with a that satisfy S; draft-04..07 `dependencies` is either, per name.
- `multipleOf k` for an integer k: integers divisible by k (a regular language, also within
  ranges); for a fractional k, the integers both readings take (`_fractional_multiple`:
  jsonschema divides binary64 values, so 0.07 / 0.01 fails and no language of fractions agrees
  with both), narrower than either reading.
- `uniqueItems` over a finite item domain (literals, booleans, null, small integer ranges) of at
  most `arrays.MAX_UNIQUE` values in the grammar; over other scalar items it is not context-free
  and is kept by the content companion (schema/unique_items.py) where one runs
  (`ctx.unique_items`); otherwise refused.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import TYPE_CHECKING

from services.grammar.schema.algebra import (
    array_type,
    free_count_check,
    number_range,
    too_few_distinct,
)
from services.grammar.schema.context import child
from services.grammar.schema.formats import VALIDATOR_TOO_LONG
from services.grammar.schema.multiples import multiple_of
from services.grammar.schema.nodes import (
    ANY,
    FULL_TYPES,
    NEVER,
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
    Pattern,
    Ref,
    Required,
    StringType,
    Union,
    make_union,
)

if TYPE_CHECKING:
    from services.grammar.schema.algebra import Graph
    from services.grammar.schema.reader import Reader

KEYWORDS = frozenset({"not", "if", "then", "else", "dependencies", "dependentRequired",
                      "dependentSchemas", "multipleOf", "uniqueItems"})

_FULL = FULL_TYPES
_KIND = {NullType: "null", BooleanType: "boolean", IntegerType: "number", NumberType: "number",
         StringType: "string", ArrayType: "array", ObjectType: "object"}


def _others(*kinds: str) -> list[Node]:
    return [n for k, n in _FULL.items() if k not in kinds]


def complement(r: "Reader", node: Node, pointer: str, depth: int = 0,
               within: frozenset[str] | None = None) -> Node | None:
    """Every JSON value not in `node`, or None where that is not exactly representable.

    `within`: the result is only ever met with values whose objects have no names outside this
    finite set (a closed object without patterns: `closed_names`), so among objects it need only
    be exact there; an undeclared name of `node` is then one of finitely many
    (`_object_complement`). It applies to the top-level objects only, never to member values."""
    r.complemented.add(pointer)  # Reader.check_foreign_complements
    g = r.graph
    if depth > 64:
        return None
    if isinstance(node, Ref):
        node = g.resolve(node, pointer)
    if isinstance(node, AnyValue):
        return NEVER
    if isinstance(node, NoValue):
        return ANY
    if isinstance(node, Union):
        out: Node = ANY
        for b in node.branches:
            c = complement(r, b, pointer, depth + 1, within)
            if c is None:
                return None
            out = g.meet(out, c, pointer)
        return out
    if isinstance(node, Literals):
        return _literals_complement(node)
    if isinstance(node, (NullType, BooleanType)):
        return make_union(_others(_KIND[type(node)]))
    if isinstance(node, NumberType):
        parts = _others("number")
        if node.lo is not None:
            parts.append(number_range(NumberType(hi=node.lo, hi_exclusive=not node.lo_exclusive),
                                      None, pointer))
        if node.hi is not None:
            parts.append(number_range(NumberType(lo=node.hi, lo_exclusive=not node.hi_exclusive),
                                      None, pointer))
        return make_union(parts)
    if isinstance(node, StringType):
        parts = _others("string")
        if node.min_length > 0:
            parts.append(StringType(0, node.min_length - 1))
        if node.max_length is not None:
            parts.append(StringType(node.max_length + 1, None))
        for p in node.patterns:
            g.pattern_check(p, negated=True)  # raises where it has no exact complement
            # a pattern every string matches has an empty complement: no value, not an error
            parts.append(g.satisfiable(StringType(patterns=(
                Pattern(p.source, p.pointer, p.whole, not p.negated, p.literal, p.fmt),))))
            if not p.negated:  # a checker's length bound beside its language (hostname's)
                for lo, hi, rx in VALIDATOR_TOO_LONG.get(p.fmt, ()) if p.whole else ():
                    parts.append(StringType(lo, hi, (Pattern(rx, p.pointer),) if rx else ()))
        return make_union(parts)
    if isinstance(node, ArrayType):
        return _array_complement(r, node, pointer, depth)
    if isinstance(node, ObjectType):
        return _object_complement(r, node, pointer, depth, within)
    return None  # IntegerType: the numbers that are not integers have no grammar here


def _literals_complement(node: Literals) -> Node | None:
    values = [json.loads(t) for t in node.texts]
    kinds = {"null" if v is None else "boolean" if isinstance(v, bool) else
             "string" if isinstance(v, str) else "number" if isinstance(v, (int, float)) else
             "other" for v in values}
    if "other" in kinds:
        return None  # arrays, objects: no exact complement here
    parts = _others(*kinds)
    if "number" in kinds:  # the open intervals between the excluded numbers
        cuts = sorted({Fraction(v) for v in values if isinstance(v, (int, float)) and
                       not isinstance(v, bool)})
        parts.append(NumberType(hi=cuts[0], hi_exclusive=True))
        parts += [number_range(NumberType(a, True, b, True), None, "")
                  for a, b in zip(cuts, cuts[1:])]
        parts.append(NumberType(lo=cuts[-1], lo_exclusive=True))
    if "boolean" in kinds:
        rest = [b for b in (True, False) if b not in [v for v in values if isinstance(v, bool)]]
        if rest:
            parts.append(Literals((json.dumps(rest[0]),)))
    if "string" in kinds:
        negated = tuple(Pattern(v, "", True, True, True) for v in values if isinstance(v, str))
        parts.append(StringType(patterns=negated))
    return make_union(parts)


def _array_complement(r: "Reader", node: ArrayType, pointer: str, depth: int) -> Node | None:
    """Arrays outside an ArrayType without prefix or uniqueItems, as the union of the ways an array
    can violate it: too short, too long, an item outside `items` (= `contains` of the complement
    of `items`: some item is not in it), or, with `contains C`, every item outside C (= `items` of
    the complement of C; the empty array included). An array is in `node` exactly when it violates
    none of them, so the union is the exact complement among arrays; other types are all in it."""
    if node.prefix or node.unique:
        return None
    g = r.graph
    parts = _others("array")
    if node.min_items > 0:
        parts.append(ArrayType(max_items=node.min_items - 1))
    if node.max_items is not None:
        parts.append(ArrayType(min_items=node.max_items + 1))
    if not isinstance(node.items, AnyValue):
        c = complement(r, node.items, pointer, depth + 1)
        if c is None:
            return None
        parts.append(array_type([], ANY, 0, None, contains=c, graph=g, pointer=pointer))
    if node.contains is not None:
        c = complement(r, node.contains, pointer, depth + 1)
        if c is None:
            return None
        parts.append(array_type([], c, 0, None, graph=g, pointer=pointer))
    return make_union(parts)


def _names_complement(g: "Graph", names: Node, pointer: str,
                      within: frozenset[str] | None = None) -> list[Node] | None:
    """Objects with a name outside `propertyNames` N, where the strings outside N are a finite set
    L (N is "no name in L": negated literals, no length; or, among objects whose names are
    `within` W, N a finite name set and L = W minus N): exactly the objects having some name of
    L, the union of `required: [l]` over l in L. None where that set is not finite here."""
    if isinstance(names, AnyValue):
        return []
    if isinstance(names, Literals) and within is not None:
        allowed = {json.loads(t) for t in names.texts}
        return [g.object_type((), (Required(n, pointer),), ANY, pointer=pointer)
                for n in sorted(within - allowed)]
    if not isinstance(names, StringType) or names.min_length or names.max_length is not None \
            or not names.patterns:
        return None
    if not all(p.negated and p.literal and p.whole for p in names.patterns):
        return None
    return [g.object_type((), (Required(p.source, pointer),), ANY, pointer=pointer)
            for p in names.patterns]


def closed_names(graph: "Graph", node: Node, pointer: str) -> frozenset[str] | None:
    """The names an object of `node` can have when that is a finite set: every object part of
    `node` is a closed object (additionalProperties false, no patternProperties: its declared
    names) or has a propertyNames of finitely many names (those); the union of these sets (empty
    where `node` has no objects); None otherwise."""
    from services.grammar.schema.values import type_domain

    node = graph.resolve(node, pointer)
    names: set[str] = set()
    for part in node.branches if isinstance(node, Union) else (node,):
        part = graph.resolve(part, pointer)
        if "object" not in type_domain(part, graph):
            continue
        if not isinstance(part, ObjectType):
            return None
        if isinstance(part.names, Literals):  # propertyNames of finitely many names
            names |= {json.loads(t) for t in part.names.texts}
        elif isinstance(part.additional, NoValue) and not part.patterns:
            names |= {k for k, _ in part.properties}
        else:
            return None
    return frozenset(names)


def _object_complement(r: "Reader", node: ObjectType, pointer: str, depth: int,
                       within: frozenset[str] | None = None) -> Node | None:
    """Objects outside `node`: the union of its violations. With `additionalProperties` A other
    than true, a violation is an undeclared name whose value is outside A; where the names are
    `within` a finite set W (see `complement`), that is some n in W minus the declared names,
    present with a value in the complement of A: one `properties: {n: not A}, required: [n]`
    object per n, exact for every object whose names lie in W."""
    g = r.graph
    if node.patterns:
        return None
    named = _names_complement(g, node.names, pointer, within)
    if named is None:
        return None
    parts = _others("object") + named
    if not isinstance(node.additional, AnyValue):
        if within is None:
            return None
        outside = complement(r, node.additional, pointer, depth + 1)
        if outside is None:
            return None
        declared = {k for k, _ in node.properties}
        parts += [g.object_type(((n, outside),), (Required(n, pointer),), ANY, pointer=pointer)
                  for n in sorted(within - declared)]
    for req in node.required:
        parts.append(g.object_type(((req.name, NEVER),), (), ANY, pointer=pointer))
    for key, value in node.properties:
        if isinstance(value, AnyValue):
            continue
        c = complement(r, value, pointer, depth + 1)
        if c is None:
            return None
        parts.append(g.object_type(((key, c),), (Required(key, pointer),), ANY, pointer=pointer))
    if node.min_props > 0:
        parts.append(ObjectType(max_props=node.min_props - 1))
    if node.max_props is not None:
        free_count_check(r.ctx, pointer, node.max_props + 1, 0, ANY, ())
        parts.append(ObjectType(min_props=node.max_props + 1))
    return make_union(parts)


# ---- application -----------------------------------------------------------------------------


def apply(r: "Reader", s: dict, node: Node, pointer: str, depth: int) -> Node:
    """`node` met with the keywords of this module present in `s`."""
    g = r.graph
    if "not" in s:
        at = child(pointer, "not")
        c = complement(r, r.flipped(s["not"], at, depth), at)  # Reader.flipped
        if c is None:
            raise r.ctx.unsupported(at, "not: the complement of this schema has no exact reduction "
                                        "(supported: types, null/boolean/string values, bounds, "
                                        "lengths, patterns, required names, property schemas, "
                                        "array items/contains, finitely many excluded names)")
        node = g.meet(node, c, at)
    if "if" in s:
        node = g.meet(node, _conditional(r, s, pointer, depth), pointer)
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        if key in s:
            node = g.meet(node, _dependencies(r, s, key, pointer, depth), child(pointer, key))
    if "multipleOf" in s:
        node = g.meet(node, multiple_of(r, s["multipleOf"], child(pointer, "multipleOf")), pointer)
    if s.get("uniqueItems") is True:
        node = _unique(r, node, child(pointer, "uniqueItems"))
    elif "uniqueItems" in s and not isinstance(s["uniqueItems"], bool):
        raise r.ctx.invalid(child(pointer, "uniqueItems"), "uniqueItems must be a boolean")
    return node


def _conditional(r: "Reader", s: dict, pointer: str, depth: int) -> Node:
    at = child(pointer, "if")
    before = r.marks()
    cond = r.read(s["if"], at, depth)
    # the condition is complemented for `else`: as the other bound where that differs
    negated = cond if r.marks() == before else r.flipped(s["if"], at, depth)
    then = r.read(s["then"], child(pointer, "then"), depth) if "then" in s else ANY
    other = r.read(s["else"], child(pointer, "else"), depth) if "else" in s else ANY
    if isinstance(then, AnyValue) and isinstance(other, AnyValue):
        return ANY
    c = complement(r, negated, at)
    if c is None:
        raise r.ctx.unsupported(at, "if: the complement of the condition has no exact reduction")
    return make_union([r.graph.meet(cond, then, at), r.graph.meet(c, other, at)])


def _dependencies(r: "Reader", s: dict, key: str, pointer: str, depth: int) -> Node:
    at = child(pointer, key)
    deps = s[key]
    if not isinstance(deps, dict):
        raise r.ctx.invalid(at, f"{key} must be an object")
    g = r.graph
    out: Node = ANY
    for name, dep in deps.items():
        here = child(at, name)
        absent = g.object_type(((name, NEVER),), (), ANY, pointer=here)
        if key != "dependentSchemas" and isinstance(dep, list):
            if not all(isinstance(n, str) for n in dep):
                raise r.ctx.invalid(here, f"{key} lists must hold property names")
            names = [name] + [n for n in dep if n != name]
            present = g.object_type((), tuple(Required(n, here) for n in dict.fromkeys(names)), ANY,
                                    pointer=here)
        elif key != "dependentRequired" and isinstance(dep, (dict, bool)):
            present = g.meet(g.object_type((), (Required(name, here),), ANY, pointer=here),
                             r.read(dep, here, depth), here)
        else:
            raise r.ctx.invalid(here, f"{key} values must be "
                                      + ("arrays of names" if key == "dependentRequired" else
                                         "schemas" if key == "dependentSchemas" else
                                         "arrays of names or schemas"))
        out = g.meet(out, make_union(_others("object") + [absent, present]), here)
    return out


def _unique(r: "Reader", node: Node, at: str) -> Node:
    """Array branches of `node` with uniqueItems (other branches are unaffected)."""
    from services.grammar.schema.arrays import finite_domain
    from services.grammar.schema.unique_items import item_domain

    def one(n: Node) -> Node:
        if isinstance(n, Union):
            return make_union([one(b) for b in n.branches])
        if isinstance(n, Ref):
            resolved = r.graph.resolve(n, at)
            return one(resolved) if isinstance(resolved, (ArrayType, Union)) else n
        if isinstance(n, AnyValue):
            n = make_union(list(_FULL.values()))
            return one(n)
        if not isinstance(n, ArrayType) or (n.max_items is not None and n.max_items <= 1):
            return n
        if not n.prefix and n.contains is None and too_few_distinct(r.graph, n.items, n.min_items):
            return NEVER  # fewer distinct items than minItems: no array of this branch is valid
        if finite_domain(r.graph, n.items, at) is None or n.prefix or n.contains is not None:
            domain = item_domain(r.graph, n.items) if r.ctx.unique_items else None
            if domain is None or n.prefix or n.contains is not None or \
                    domain.at_least < n.min_items:
                raise r.ctx.unsupported(at, "uniqueItems is supported over a finite item domain "
                                            "(enum/const, booleans, null, small integer ranges) "
                                            "and, for JSON content, over scalar items (strings, "
                                            "integers, scalar enum/const) without prefixItems or "
                                            "contains and with minItems within the distinct "
                                            "values provable")
            if r.ctx.unique_items_at is None:
                r.ctx.unique_items_at = at
        return ArrayType(n.prefix, n.items, n.min_items, n.max_items, True, n.contains)

    return one(node)
