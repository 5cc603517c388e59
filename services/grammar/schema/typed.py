"""The type-specific assertions of one schema object, as typed nodes (one per allowed type).

Numbers (bounds, draft-04 boolean exclusive bounds, OpenAPI integer formats), strings (length,
pattern, format), arrays (positions, tail, length) and objects (properties, required, additional
properties). Subschemas are read through the reader passed in; every error names its pointer.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from services.grammar.schema import formats
from services.grammar.schema.algebra import (
    array_type,
    free_count_check,
    integer_bounds,
    number_range,
    string_type,
)
from services.grammar.schema.context import child
from services.grammar.schema.nodes import (
    ANY,
    INT64_MAX,
    INT64_MIN,
    TYPE_NAMES,
    BooleanType,
    IntegerType,
    Node,
    NullType,
    NumberType,
    Pattern,
    Required,
    StringType,
    make_union,
)
from shared.contract import RoundedNumber

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader

# Keywords whose presence splits a schema object into per-type branches.
TYPE_SPECIFIC = frozenset(
    {
        "contains",
        "minContains",
        "maxContains",
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "format",
    }
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def own_node(r: "Reader", s: dict, pointer: str, depth: int) -> Node:
    """The union over the allowed types of each type's own assertions."""
    fmt = _format(r, s, pointer)
    if "type" not in s and fmt is None and not any(k in s for k in TYPE_SPECIFIC - {"format"}):
        return ANY
    types = _types(r, s, pointer)
    branches: list[Node] = []
    for t in types:
        if t == "integer" and "number" in types:
            continue  # integers are numbers: the number branch covers them
        if t == "null":
            branches.append(NullType())
        elif t == "boolean":
            branches.append(BooleanType())
        elif t in ("integer", "number"):
            branches.append(_number(r, s, pointer, t, fmt))
        elif t == "string":
            branches.append(_string(r, s, pointer, fmt))
        elif t == "array":
            branches.append(_array(r, s, pointer, depth))
        else:
            branches.append(_object(r, s, pointer, depth))
    return make_union(branches)


def _types(r: "Reader", s: dict, pointer: str) -> list[str]:
    if "type" not in s:
        return list(TYPE_NAMES)
    t = s["type"]
    at = child(pointer, "type")
    names = [t] if isinstance(t, str) else t
    if not isinstance(names, list) or not names:
        raise r.ctx.invalid(at, "type must be a type name or a non-empty array of them")
    for n in names:
        if n not in TYPE_NAMES:
            raise r.ctx.invalid(at, f"unknown type {n!r}")
    if len(set(names)) != len(names):
        raise r.ctx.invalid(at, "type array has duplicates")
    return names


def _format(r: "Reader", s: dict, pointer: str) -> str | None:
    if "format" not in s:
        return None
    at = child(pointer, "format")
    name = s["format"]
    if not isinstance(name, str):
        raise r.ctx.invalid(at, "format must be a string")
    if name in formats.KNOWN:
        return name
    meant = formats.READ_AS.get(name) or formats.resembles(name)
    if meant in formats.KNOWN:
        # A draft-03 name the declared dialect's validators do not check, or a near-miss whose
        # author meant the format it resembles: every value is valid for the declared reading, so
        # enforcing the format generates values valid in both (misspelt.py); under a complement
        # it would widen instead (Reader.check_foreign_complements).
        r.annotations.add(f"format:{name}={meant}")
        r.foreign.append(at)
        return meant
    if name in formats.SPEC_UNREDUCED:
        raise r.ctx.unsupported(at, f"format {name!r} is not supported (known formats: "
                                    f"{', '.join(sorted(formats.KNOWN))})")
    if meant is not None:
        raise r.ctx.unsupported(at, f"unknown format {name!r} looks like the format {meant!r} (it "
                                    "would be ignored as an annotation)")
    # No specification defines it: an annotation (formats.py), listed, never silently dropped.
    r.annotations.add(f"format:{name}")
    return None


def count(r: "Reader", s: dict, key: str, pointer: str) -> int | None:
    if key not in s:
        return None
    v = s[key]
    rounded(r, v, child(pointer, key))
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise r.ctx.invalid(child(pointer, key), f"{key} must be a non-negative integer")
    return v


def rounded(r: "Reader", v: Any, at: str) -> None:
    """Refuse a number JSON parsing rounded (the source's digits are not the value read): the
    design rejects such assertions and const/enum values where the source is read."""
    if isinstance(v, RoundedNumber):
        raise r.ctx.unsupported(at, f"the number {v.text[:60]} is rounded by JSON parsing (to "
                                    f"{float(v)!r}); write a value binary64 holds")


def _bound(r: "Reader", s: dict, key: str, pointer: str) -> Fraction | None:
    if key not in s:
        return None
    v = s[key]
    at = child(pointer, key)
    if not _is_number(v):
        raise r.ctx.invalid(at, f"{key} must be a number")
    rounded(r, v, at)
    if isinstance(v, float) and not math.isfinite(v):
        raise r.ctx.unsupported(at, f"{key} is a value JSON parsing would round to infinity")
    value = Fraction(v)
    # Generated numbers lie inside signed 64-bit (integers) and below 2**63 in magnitude
    # (decimals), so an upper bound at or above 2**63, or a lower bound below -2**63, cuts nothing.
    if key in ("maximum", "exclusiveMaximum") and value >= 2**63:
        return None
    if key in ("minimum", "exclusiveMinimum") and value < INT64_MIN:
        return None
    if not INT64_MIN <= value <= INT64_MAX:
        raise r.ctx.unsupported(at, f"{key} {v} is outside signed 64-bit")
    return value


def _number(r: "Reader", s: dict, pointer: str, t: str, fmt: str | None) -> Node:
    lo, lo_ex = _bound(r, s, "minimum", pointer), False
    hi, hi_ex = _bound(r, s, "maximum", pointer), False
    if r.dialect.boolean_exclusive:  # draft-04: booleans that make minimum/maximum exclusive
        for key, base in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if key in s:
                if not isinstance(s[key], bool):
                    raise r.ctx.invalid(child(pointer, key), f"{key} must be a boolean in draft-04")
                if base not in s:
                    raise r.ctx.invalid(child(pointer, key), f"{key} needs {base} in draft-04")
        lo_ex = s.get("exclusiveMinimum") is True
        hi_ex = s.get("exclusiveMaximum") is True
    else:
        elo = _bound(r, s, "exclusiveMinimum", pointer)
        ehi = _bound(r, s, "exclusiveMaximum", pointer)
        if elo is not None and (lo is None or elo >= lo):
            lo, lo_ex = elo, True
        if ehi is not None and (hi is None or ehi <= hi):
            hi, hi_ex = ehi, True
    num = NumberType(lo, lo_ex, hi, hi_ex)
    if fmt in formats.INTEGER_FORMATS:
        return integer_bounds(num, *formats.INTEGER_FORMATS[fmt])
    if t == "integer":
        return integer_bounds(num, INT64_MIN, INT64_MAX)
    where = next((child(pointer, k) for k in ("exclusiveMaximum", "maximum", "exclusiveMinimum",
                                                "minimum") if k in s), pointer)
    return number_range(num, r.ctx, where)


def _string(r: "Reader", s: dict, pointer: str, fmt: str | None) -> Node:
    lo = count(r, s, "minLength", pointer) or 0
    hi = count(r, s, "maxLength", pointer)
    patterns: tuple[Pattern, ...] = ()
    if "pattern" in s:
        at = child(pointer, "pattern")
        if not isinstance(s["pattern"], str):
            raise r.ctx.invalid(at, "pattern must be a string")
        patterns = (Pattern(s["pattern"], at),)
    if fmt in formats.STRING_FORMATS:
        # a format's own length bound (hostname's) is applied where its automaton is built
        # (patterns.string_dfa), not folded into maxLength: a complement of maxLength is not one
        # of the format (the checker's bound is formats.VALIDATOR_TOO_LONG)
        regex = formats.STRING_FORMATS[fmt][0]
        patterns += (Pattern(regex, child(pointer, "format"), whole=True, fmt=fmt),)
    elif fmt is not None and fmt not in formats.STRING_NO_CONSTRAINT and "type" in s and \
            s["type"] == "string":
        raise r.ctx.unsupported(
            child(pointer, "format"), f"format {fmt!r} does not apply to strings"
        )
    return r.graph.satisfiable(string_type(lo, hi, patterns))


def _array(r: "Reader", s: dict, pointer: str, depth: int) -> Node:
    prefix: list[Node] = []
    items: Node = ANY
    items_at = child(pointer, "items")
    if not r.dialect.items_array:
        if "prefixItems" in s:
            at = child(pointer, "prefixItems")
            if not isinstance(s["prefixItems"], list) or not s["prefixItems"]:
                raise r.ctx.invalid(at, "prefixItems must be a non-empty array of schemas")
            prefix = [r.read(x, child(at, i), depth) for i, x in enumerate(s["prefixItems"])]
        if "items" in s:
            if isinstance(s["items"], list):
                raise r.ctx.invalid(items_at, "items must be a schema in 2020-12 "
                                              "(use prefixItems for positions)")
            items = r.read(s["items"], items_at, depth)
    else:
        if isinstance(s.get("items"), list):
            prefix = [r.read(x, child(items_at, i), depth) for i, x in enumerate(s["items"])]
            if "additionalItems" in s:
                items = r.read(s["additionalItems"], child(pointer, "additionalItems"), depth)
        elif "items" in s:
            items = r.read(s["items"], items_at, depth)
        elif "additionalItems" in s:  # asserts nothing without an items array, but is still read
            r.read(s["additionalItems"], child(pointer, "additionalItems"), depth)
    contains = None
    if "contains" in s:
        for key in ("minContains", "maxContains"):
            if key in s and not (key == "minContains" and s[key] == 1):
                raise r.ctx.unsupported(child(pointer, key), f"{key} is not supported")
        contains = r.read(s["contains"], child(pointer, "contains"), depth)
    return array_type(prefix, items, count(r, s, "minItems", pointer) or 0,
                      count(r, s, "maxItems", pointer), False, contains, r.graph,
                      child(pointer, "contains"))


def _object(r: "Reader", s: dict, pointer: str, depth: int) -> Node:
    props: list[tuple[str, Node]] = []
    if "properties" in s:
        at = child(pointer, "properties")
        if not isinstance(s["properties"], dict):
            raise r.ctx.invalid(at, "properties must be an object of schemas")
        for name, sub in s["properties"].items():
            r.check_text(name, child(at, name))
            props.append((name, r.read(sub, child(at, name), depth)))
    required: list[Required] = []
    if "required" in s:
        at = child(pointer, "required")
        names = s["required"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise r.ctx.invalid(at, "required must be an array of strings")
        if len(set(names)) != len(names):
            raise r.ctx.invalid(at, "required has duplicate names")
        required = [Required(n, child(at, i)) for i, n in enumerate(names)]
    additional = ANY
    if "additionalProperties" in s:
        additional = r.read(
            s["additionalProperties"], child(pointer, "additionalProperties"), depth
        )
    patterns: list[tuple[Pattern, Node]] = []
    if "patternProperties" in s:
        at = child(pointer, "patternProperties")
        if not isinstance(s["patternProperties"], dict):
            raise r.ctx.invalid(at, "patternProperties must be an object of schemas")
        for source, sub in s["patternProperties"].items():
            pattern = Pattern(source, child(at, source))
            r.graph.pattern_check(pattern)  # the pattern must parse (raises at its pointer)
            patterns.append((pattern, r.read(sub, child(at, source), depth)))
    names: Node = ANY
    if "propertyNames" in s:
        names = r.read(s["propertyNames"], child(pointer, "propertyNames"), depth)
        names = r.graph.meet(names, StringType(), pointer)
    least = count(r, s, "minProperties", pointer) or 0
    free_count_check(r.ctx, child(pointer, "minProperties"), least,
                     len({q.name for q in required}), additional, tuple(patterns), names)
    return r.graph.object_type(tuple(props), tuple(required), additional, tuple(patterns), names,
                               least,
                               count(r, s, "maxProperties", pointer), pointer)


__all__ = ["TYPE_SPECIFIC", "count", "own_node", "IntegerType"]
